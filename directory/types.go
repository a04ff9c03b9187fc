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
	SessionID    string
	ClientID     string
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
	Owner *Owner
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
	SessionID string
	ClientID  string
	Headroom  float64
}

// Registration is a validated register request (R-REG-1). Its client id,
// namespaces, hostname and envs hold no NUL byte (the registry refuses
// them): the stores separate names with NUL in row names ("ns\x00id"),
// binding keys and Redis tombs.
type Registration struct {
	ClientID      string
	Sub           string // principal that registered; heartbeats must match
	Secret        string
	Namespaces    []string
	AdvertiseURL  string
	Headroom      float64
	Draining      bool
	Hostname      string
	Env           string
	Envs          map[string]string
	Takeover      string
	Epoch         int64
	PrevSessionID string
	// Instances are the ids the worker still hosts, by namespace; on a
	// re-registration they are reclaimed for the new session unless another
	// live session owns them (then they come back as duplicates).
	Instances map[string][]string
}

// NSID names one instance.
type NSID struct {
	NS string `json:"ns"`
	ID string `json:"id"`
}

// RegisterResult is the store's answer to Register.
type RegisterResult struct {
	SessionID  string
	LeaseUntil time.Time
	Duplicates []NSID
	Drain      DrainState
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
	SessionID string
	ClientID  string
}

// DrainState is the operator drain on a client id (R-REG-6, R-LS-5).
type DrainState struct {
	Draining bool
	// Deadline is the forced-release time of a timed drain; zero for an
	// untimed drain.
	Deadline time.Time
}

// Beat is a heartbeat after the probe ran (R-REG-2).
type Beat struct {
	SessionID string
	Sub       string
	Headroom  float64
	Draining  bool
	// Degraded is true when this heartbeat's challenge probe failed.
	Degraded bool
	Acks     []string
}

// BeatResult is what a renewed heartbeat returns.
type BeatResult struct {
	LeaseUntil time.Time
	Draining   bool // own flag or operator drain
	Drain      DrainState
	Messages   []ControlMessage
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
	MsgID    string
	Type     string
	NS       string
	ID       string
	Deadline *time.Time
}

// SessionInfo is a session as the registry and operators see it.
type SessionInfo struct {
	SessionID     string
	ClientID      string
	Sub           string
	Secret        string
	AdvertiseURL  string
	Namespaces    []string
	Hostname      string
	Env           string
	Envs          map[string]string
	Epoch         int64
	Headroom      float64
	Draining      bool
	Degraded      bool
	DegradedSince time.Time
	LeaseUntil    time.Time
	RegisteredAt  time.Time
	Drain         DrainState
	Placements    int
}

// PlacementInfo answers "which worker owns this id".
type PlacementInfo struct {
	NS        string
	ID        string
	SessionID string
	ClientID  string
	Advertise string
	Epoch     uint64
	Live      bool
}

// ReleaseRequest frees one placement (R-REG-3). Epoch 0 releases whatever
// epoch the session holds; otherwise only that epoch.
type ReleaseRequest struct {
	SessionID string
	NS        string
	ID        string
	Epoch     uint64
}
