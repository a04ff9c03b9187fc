// Package directory is pinboard's directory: which worker session owns which
// (namespace, id), which sessions are live, and the control state riding on
// them (drains, control messages, the cold-start stamp).
//
// The Store interface is the contract both stores satisfy: the in-process
// memory store (REDIS_URL=memory:) and the Redis store. Every operation that
// decides ownership is atomic within the store, so any number of stateless
// pinboard nodes sharing one store agree on exactly one owner per id (R-PL-1).
package directory

import (
	"math"
	"sync/atomic"
	"time"
)

// Owner is what the data plane needs to forward a request to a worker
// session. Its identity fields never change after creation; the lease is
// updated in place so a cached *Owner sees renewals and revocations without
// a store round trip.
//
// Owners are shared: never modify the exported fields.
type Owner struct {
	// SessionID is the worker session's id, minted by the store at register
	// (NewSessionID); forwarded requests carry it as the attestation's aud.
	SessionID string
	// ClientID is the worker process's clientId from its register body.
	ClientID string
	// AdvertiseURL is the worker's base URL from its register body: the
	// data plane forwards the owner's requests there.
	AdvertiseURL string
	// Secret is the HMAC key the worker verifies proxy attestations with
	// (its register `secret`); never listed or logged.
	Secret []byte

	leaseUntil atomic.Int64 // unix nanoseconds; revokedLease once revoked
	ext        atomic.Value
}

// Ext returns the data plane's per-owner state (connection pool,
// attestation cache), kept here so a hot lookup needs no second map.
func (o *Owner) Ext() any { return o.ext.Load() }

// SetExtIfAbsent stores v unless a value is already set, and returns the
// value in place.
func (o *Owner) SetExtIfAbsent(v any) any {
	if o.ext.CompareAndSwap(nil, v) {
		return v
	}
	return o.ext.Load()
}

// CompareAndSwapExt replaces the data plane's state when it is still old
// (the proxy renews a state whose connection pool was swept away).
func (o *Owner) CompareAndSwapExt(old, v any) bool { return o.ext.CompareAndSwap(old, v) }

// NewOwner returns an Owner whose lease runs until leaseUntil.
func NewOwner(sessionID, clientID, advertiseURL string, secret []byte, leaseUntil time.Time) *Owner {
	o := &Owner{SessionID: sessionID, ClientID: clientID, AdvertiseURL: advertiseURL, Secret: secret}
	o.leaseUntil.Store(leaseUntil.UnixNano())
	return o
}

// Live reports whether the owner's lease is still running at now. A lapsed
// lease makes the owner's placements re-placeable (R-LS-2).
func (o *Owner) Live(now time.Time) bool {
	return now.UnixNano() < o.leaseUntil.Load()
}

// LeaseUntil returns the current lease expiry.
func (o *Owner) LeaseUntil() time.Time { return time.Unix(0, o.leaseUntil.Load()) }

// revokedLease marks a revoked Owner. It is below every real expiry, so
// Live is false, and SetLeaseUntil never replaces it.
const revokedLease = math.MinInt64

// SetLeaseUntil moves the lease expiry; stores call it on renewals. A
// revoked Owner stays revoked: a store may read a lease from Redis just
// before the session ends and store it just after, and that late renewal
// must not bring the session's routes back.
func (o *Owner) SetLeaseUntil(t time.Time) {
	v := t.UnixNano()
	for {
		old := o.leaseUntil.Load()
		if old == revokedLease || o.leaseUntil.CompareAndSwap(old, v) {
			return
		}
	}
}

// Revoke ends the lease at once and for good (deregister, voided or
// superseded registration, a session gone from Redis).
func (o *Owner) Revoke() { o.leaseUntil.Store(revokedLease) }

// Revoked reports whether the store ended the session for good. Unlike a
// lease that only ran out here (a Redis the node cannot reach to learn
// of renewals), it is the store's word that the session is over.
func (o *Owner) Revoked() bool { return o.leaseUntil.Load() == revokedLease }

// Route is a resolved placement: the owning session and the placement epoch
// the worker fences on (the `pinboard-epoch` header).
type Route struct {
	// Owner is the owning session; nil only in the zero Route of a miss
	// or an error.
	Owner *Owner
	// Epoch is the placement epoch, minted by the store when the id was
	// placed and kept when a re-registration of the same process reclaims
	// it. Each one minted is above every earlier one, across restarts and
	// wipes too (minting then resumes at or above the clock's
	// microseconds), given clocks that do not step back: workers fence on
	// them.
	Epoch uint64
	// Placed is true when this resolution created the placement (a new
	// activation on the worker); the proxy retries in-band refusals of new
	// placements elsewhere (R-PL-6).
	Placed bool
	// Replaced is true for a placement made over the row of an owner
	// whose lease had passed (a crashed or cut-off worker, R-LS-2) or that
	// was excluded: the id moved (pinboard_placements_total{kind="replaced"}).
	Replaced bool
}

// Candidate is an eligible worker session for a new placement (R-PL-1):
// live, undrained, not degraded, serving the namespace.
type Candidate struct {
	// SessionID is the session the placement would go to.
	SessionID string
	// ClientID is the session's worker process: HeadroomPolicy's rendezvous
	// order hashes it, so a key keeps its worker across re-registrations.
	ClientID string
	// Headroom is the session's headroom when ranked: its last register or
	// heartbeat's value less one per placement since (R-PL-3). A weight,
	// not a limit; it may be zero or negative. The Redis store ranks its
	// node's view of it, which a concurrent claim on another node may have
	// moved; the claim does not check headroom again.
	Headroom float64
}

// Registration is a validated register request (R-REG-1). Its client id,
// namespaces, hostname and envs hold no NUL byte (the registry refuses
// them): the stores separate names with NUL in row names ("ns\x00id"),
// binding keys and Redis tombs.
type Registration struct {
	// ClientID is the worker's clientId, minted once per process: the
	// operator drain is set on it, and the earlier sessions of the same
	// ClientID and Sub are the process's, handed over to the new one.
	ClientID string
	Sub      string // principal that registered; heartbeats must match
	// Secret is the HMAC key the worker verifies proxy attestations with,
	// also sent on its challenge probes (registry.ProxySecretHeader);
	// never listed or logged.
	Secret string
	// Namespaces are the namespaces the session serves, each with its
	// leading slash ("/counters"); the registry refuses repeats.
	Namespaces []string
	// AdvertiseURL is the worker's base URL, probed at register and each
	// heartbeat and forwarded to. A registration voids the session of
	// another process registered at the same URL (RegisterResult.Voided).
	AdvertiseURL string
	// Headroom is the session's starting headroom, a placement weight
	// (R-PL-3): each placement spends one until a heartbeat replaces it.
	Headroom float64
	// Draining is the worker's own drain flag: while set, the session gets
	// no new placements. It is apart from the operator drain (DrainState).
	Draining bool
	// Hostname, when not empty, binds {Hostname}{ns} for each namespace
	// to its env at Epoch (hostname-aware bindings, R-LS-4). Compared
	// without regard to ASCII case; the registry strips a trailing dot.
	Hostname string
	// Env is the env the hostname binds each namespace to, unless Envs
	// has an entry for it (EnvOf).
	Env string
	// Envs are per-namespace env overrides, by namespace (EnvOf).
	Envs map[string]string
	// Takeover decides a registration at the epoch of a live binding
	// with another env: "wind_down" supersedes the sessions holding it;
	// with "deny" or "" the store refuses it with a *SupersededError
	// (DecideBinding).
	Takeover string
	// Epoch is the registration epoch the worker declared, not a
	// placement epoch: a higher one takes a hostname's bindings from a
	// lower one (R-LS-4). 0 when none was declared.
	Epoch int64
	// PrevSessionID is the session this process held before, "" on its
	// first registration. Only a session of the same ClientID and Sub is
	// handed over (another named here is ignored); it goes first, and the
	// other sessions of the same ClientID and Sub are handed over too,
	// named or not.
	PrevSessionID string
	// Instances are the ids the worker still hosts, by namespace; on a
	// re-registration they are reclaimed for the new session unless another
	// live session owns them (then they come back as duplicates).
	Instances map[string][]string
}

// NSID names one instance.
type NSID struct {
	// NS is the namespace, with its leading slash ("/counters").
	NS string `json:"ns"`
	// ID is the instance id within NS (CheckID).
	ID string `json:"id"`
}

// RegisterResult is the store's answer to Register.
type RegisterResult struct {
	// SessionID is the new session's id (NewSessionID).
	SessionID string
	// LeaseUntil is when the new session's lease ends: one lease TTL after
	// the registration's time, capped by a timed drain (R-LS-5).
	LeaseUntil time.Time
	// Duplicates are the listed instances the session did not get: those
	// of a namespace it does not serve, and those another live session
	// held when the registration reached them (it reclaims them
	// RegisterBatch at a time, so an id placed elsewhere between two
	// batches is one too), including sessions it superseded or voided
	// (R-REG-1). The worker aborts them.
	Duplicates []NSID
	// Drain is the operator drain on the client id, zero when none. A
	// timed drain whose deadline plus one lease has passed comes back
	// untimed, and the store keeps it so.
	Drain DrainState
	// Voided are the sessions of other processes that were registered at
	// the same advertise URL, dropped by this registration (R-LS-3): its
	// challenge probe, answered there with the new session's secret,
	// proved the URL no longer reaches them. A worker restarted in place
	// (the same host and port, a new clientId) would otherwise leave its
	// dead predecessor's session live until the lease lapses, and the
	// predecessor's ids routed to the new process, which refuses an
	// attestation signed with the old secret: 403s for up to a lease.
	Voided []SessionRef
}

// SessionRef names a session and its client id (for logs).
type SessionRef struct {
	// SessionID is the session's id.
	SessionID string
	// ClientID is the clientId the session registered with.
	ClientID string
}

// DrainState is the operator drain on a client id (R-REG-6, R-LS-5).
type DrainState struct {
	// Draining is true while an operator drain is set on the client id:
	// none of its sessions gets new placements. SetDrain with it false
	// undrains.
	Draining bool
	// Deadline is the forced-release time of a timed drain; zero for an
	// untimed drain.
	Deadline time.Time
}

// Beat is a heartbeat after the probe ran (R-REG-2).
type Beat struct {
	// SessionID is the session the heartbeat renews.
	SessionID string
	// Sub is the principal that sent the heartbeat; it must be the
	// registration's Sub, else ErrForbidden.
	Sub string
	// Headroom replaces the session's headroom, undoing what placements
	// spent of it since the last report (R-PL-3).
	Headroom float64
	// Draining replaces the worker's own drain flag (Registration.Draining).
	Draining bool
	// Degraded is true when this heartbeat's challenge probe failed.
	Degraded bool
	// Acks are the MsgIDs of control messages the worker has taken; they
	// leave the session's queue. Ids not queued are ignored.
	Acks []string
}

// BeatResult is what a renewed heartbeat returns.
type BeatResult struct {
	// LeaseUntil is the renewed lease's end: one lease TTL after the
	// heartbeat's time, capped by a timed drain (R-LS-5).
	LeaseUntil time.Time
	Draining   bool // own flag or operator drain
	// Drain is the operator drain on the session's client id, zero when
	// none.
	Drain DrainState
	// Messages are the control messages still queued for the session
	// after the acks, in queue order: each comes back with every
	// heartbeat until acked (R-CM-1).
	Messages []ControlMessage
	// WasDegraded and WasDraining are the session's degraded state and
	// own drain flag before this heartbeat, read in the same atomic step
	// that replaced them: the registry logs a transition ("degraded",
	// "recovered", "drain") from them, once per change, whichever node
	// took the heartbeat before.
	WasDegraded, WasDraining bool
}

// ControlMessage is a queued wind_down (R-CM-1). Deadline is absolute; nil
// revokes an earlier wind-down. The registry turns it into seconds from
// delivery.
type ControlMessage struct {
	// MsgID is the message's id (NewMsgID), which the worker acks.
	MsgID string
	// Type is always "wind_down".
	Type string
	// NS is the wound-down instance's namespace, with its leading slash.
	NS string
	// ID is the wound-down instance's id.
	ID string
	// Deadline is when the sweep frees the placement, if it is still the
	// one wound down (same epoch); nil revokes. The Redis store keeps it
	// to the microsecond.
	Deadline *time.Time
}

// SessionInfo is a session as the registry and operators see it. The
// fields from SessionID to Epoch are set at register and never change.
// Times are absolute; the Redis store keeps them to the microsecond.
type SessionInfo struct {
	// SessionID is the session's id (NewSessionID).
	SessionID string
	// ClientID is the worker process's clientId (Registration.ClientID).
	ClientID string
	// Sub is the principal that registered; heartbeats must match it.
	Sub string
	// Secret is the worker's attestation key; never listed or logged.
	Secret string
	// AdvertiseURL is the worker's base URL.
	AdvertiseURL string
	// Namespaces are the namespaces it serves, each with its leading slash.
	Namespaces []string
	// Hostname is its hostname binding, "" for none (R-LS-4).
	Hostname string
	// Env is its env (Registration.Env).
	Env string
	// Envs are its per-namespace env overrides (EnvOf); empty for none.
	Envs map[string]string
	// Epoch is its registration epoch (Registration.Epoch), not a
	// placement epoch; 0 when it declared none.
	Epoch int64
	// Headroom is its last reported headroom less one per placement since
	// (R-PL-3); it may be negative.
	Headroom float64
	// Draining is the worker's own drain flag; the operator's is Drain.
	Draining bool
	// Degraded is true when its last heartbeat's challenge probe failed:
	// it gets no new placements until one succeeds.
	Degraded bool
	// DegradedSince is when the heartbeats' probes began failing; zero
	// when not Degraded.
	DegradedSince time.Time
	// LeaseUntil is when its lease ends, unless a heartbeat renews it.
	LeaseUntil time.Time
	// RegisteredAt is the time its registration was made at (the now
	// passed to Register).
	RegisteredAt time.Time
	// Drain is the operator drain on ClientID, zero when none.
	Drain DrainState
	// Placements is the number of placements it holds, in every namespace.
	Placements int
}

// PlacementInfo answers "which worker owns this id".
type PlacementInfo struct {
	// NS is the namespace asked about, with its leading slash.
	NS string
	// ID is the instance id asked about.
	ID string
	// SessionID is the session the placement points at, which may have
	// ended (see Live).
	SessionID string
	// ClientID is that session's clientId. The Redis store gives "" once
	// the session's record is gone and its rows wait to be freed; the
	// memory store still gives it then.
	ClientID string
	// Advertise is that session's advertise URL; "" as ClientID is.
	Advertise string
	// Epoch is the placement epoch.
	Epoch uint64
	// Live is true while the session's lease runs: a placement that is not
	// live is placed anew by the next request for it (R-LS-2).
	Live bool
}

// ReleaseRequest frees one placement (R-REG-3). Epoch 0 releases whatever
// epoch the session holds; otherwise only that epoch.
type ReleaseRequest struct {
	// SessionID is the releasing session: only a placement it holds is
	// freed.
	SessionID string
	// NS is the instance's namespace, with its leading slash.
	NS string
	// ID is the instance's id.
	ID string
	// Epoch is the placement epoch to free, or 0 for any.
	Epoch uint64
}
