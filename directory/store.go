package directory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Store is the directory contract. Both stores pass the same contract suite
// (package directorytest). All methods are safe for concurrent use.
//
// Times are passed in by the caller (from its Clock) so tests can drive
// leases without sleeping; a Redis store shared by many nodes compares them
// with the times other nodes wrote, so node clocks must agree to well under
// one lease.
type Store interface {
	// Lookup is the data plane's fast path: the live owner of (ns, id), if
	// any, without a store round trip for hot ids. It must not allocate.
	// The returned Route's Placed is always false.
	Lookup(ns, id []byte, now time.Time) (Route, bool)

	// Place resolves (ns, id) or claims it atomically on an eligible worker
	// (R-PL-1): an existing live owner wins; otherwise the first candidate
	// of req.Policy's ranking that is still eligible becomes the owner, its
	// headroom drops by one (R-PL-3) and a new epoch is minted.
	//
	// Errors: ErrUnknownNamespace (no live worker serves ns), ErrNoEligible
	// (workers serve ns but none can take new placements), *QuarantineError
	// (cold start, R-CS-1), ErrUnavailable (store down).
	Place(ctx context.Context, req *PlaceRequest) (Route, error)

	// Register creates a session (R-REG-1) and reclaims the ids listed in
	// Instances for it; ids another live session owns come back as
	// duplicates. The ids are reclaimed RegisterBatch at a time, each
	// batch in one atomic step of the store, so other calls proceed in
	// between however many ids a worker lists.
	Register(ctx context.Context, reg *Registration, now time.Time) (*RegisterResult, error)

	// Session returns a session that is still inside its lease, or
	// ErrUnknownSession, or a *SupersededError for a session a
	// higher-epoch registration displaced (R-LS-4) while that is
	// remembered: callers that only ask whether the session is live treat
	// both as gone.
	Session(ctx context.Context, sessionID string, now time.Time) (*SessionInfo, error)

	// Heartbeat renews the lease (R-LS-1), replaces headroom and the own
	// drain flag, records the probe outcome, trims acked control messages
	// and returns the pending ones (R-CM-1). ErrUnknownSession when the
	// session is unknown or its lease has lapsed (R-LS-2); ErrForbidden
	// when another account registered it.
	Heartbeat(ctx context.Context, beat *Beat, now time.Time) (*BeatResult, error)

	// Void drops a session and its placements at once (probe answered a
	// different value, R-LS-3).
	Void(ctx context.Context, sessionID string, now time.Time) error

	// Deregister ends a session on plain shutdown; its placements are freed
	// (R-REG-3). Unknown sessions are not an error.
	Deregister(ctx context.Context, sessionID string, now time.Time) error

	// Release frees one placement if the session still holds it (at the
	// given epoch, when non-zero). It reports whether a row was freed.
	Release(ctx context.Context, req *ReleaseRequest, now time.Time) (bool, error)

	// ReleaseBatch is Release for each of reqs, in order, and reports how
	// many rows it freed. A worker sends its releases as one batch of up
	// to thousands (RegistrationClient._flush_releases): they are made
	// RegisterBatch at a time, each batch one atomic step of the store —
	// one round trip to Redis — so a batch costs tens of round trips, not
	// one per row. On an error the count is of the rows freed before it.
	ReleaseBatch(ctx context.Context, reqs []ReleaseRequest, now time.Time) (int, error)

	// Workers lists live sessions (R-REG-4).
	Workers(ctx context.Context, now time.Time) ([]SessionInfo, error)

	// SetDrain sets or clears the operator drain on every session of a
	// client id (R-REG-6). It reports whether a live session has that id.
	SetDrain(ctx context.Context, clientID string, drain DrainState, now time.Time) (bool, error)

	// WindDown queues a wind_down control message for the owner of (ns, id)
	// (R-CM-1); deadline nil revokes. owner, when not empty, is the session
	// the caller checked the id's owner to be (an operator's credential
	// reaches that worker): any other live owner gets ErrOwnerChanged and
	// nothing is queued, so a placement that moved since the check is not
	// wound down on a worker nobody checked. It returns the message id and
	// the owning session, or ErrNoPlacement.
	WindDown(ctx context.Context, ns, id, owner string, deadline *time.Time, now time.Time) (msgID, sessionID string, err error)

	// Placement reports who owns (ns, id), live or not.
	Placement(ctx context.Context, ns, id string, now time.Time) (*PlacementInfo, error)

	// Quarantine is the remaining cold-start quarantine (R-CS-1); zero
	// before the first placement attempt and once it has passed.
	Quarantine(ctx context.Context, now time.Time) (time.Duration, error)

	// Sweep removes what expired (dead sessions' rows, idle control
	// queues) and force-releases placements past a timed drain's deadline.
	// Nodes call it periodically; it is safe to run on many nodes at once.
	Sweep(ctx context.Context, now time.Time) error

	// Name is the store kind for health output ("memory", "redis").
	Name() string

	// Close releases the store's resources.
	Close() error
}

// ExpiredCounter is an optional Store ability: how many sessions have
// passed their lease and are not dropped yet (the sweep drops them one
// lease later, R-LS-2). Workers lists live sessions only, so these are
// counted apart, for pinboard_workers{state="expired"}.
type ExpiredCounter interface {
	Expired(ctx context.Context, now time.Time) (int, error)
}

// RegisterBatch is how many listed instances a registration reclaims in
// one atomic step of a store: one script call on Redis, one hold of the
// memory store's lock. Redis serves nobody else while a script runs, so
// the batch bounds how long a worker listing the registry's 100,000
// instances at most stalls every node's round trips: at about 15 µs per
// id, 256 hold Redis 3–4 ms, while the round trip each batch adds (tens of
// µs here, 1 ms across zones) stays a small part of the registration
// (docs/DIRECTORY.md, "Scripts").
const RegisterBatch = 256

// registrationEnded is the error of a registration whose session ended
// between two batches of its instances: a tomb's SupersededError as it
// is, an unknown session (dropped by a later registration of the same
// process) wrapped to say so.
func registrationEnded(clientID, sessionID string, err error) error {
	if errors.Is(err, ErrUnknownSession) {
		return fmt.Errorf("cannot register %q: session %s ended before its instances were reclaimed: %w", clientID, sessionID, err)
	}
	return err
}

// PlaceRequest is one placement attempt. The policy runs inside the store's
// atomic section for the memory store, and before the claim script for
// Redis, which then claims the first still-eligible ranked candidate. A
// store keeps nothing of it past Place: callers reuse it.
type PlaceRequest struct {
	NS, ID string // the instance: the namespace with its leading slash, the id
	// Now is the request's time from the caller's clock: leases are
	// compared with it and the cold-start stamp is taken from it (R-CS-1).
	Now time.Time
	// Policy ranks eligible candidates; nil uses DefaultPolicy.
	Policy Policy
	// Pick carries the request's affinity inputs to the policy.
	Pick PickInput
	// Exclude is a session that must not receive the placement (the worker
	// that just refused it in-band, R-PL-6).
	Exclude string
	// ExcludeEpoch, when set, is the refused placement's epoch: only
	// Exclude's row at that epoch is placed anew. Released just before
	// (or its release failed), any other live row is a placement another
	// request made since — on Exclude too, which refused only this one —
	// and wins like any live owner (R-PL-1); replaced, the id ran on two
	// workers. 0 places anew over any row of Exclude.
	ExcludeEpoch uint64
	// Host is the request's host name without port. When workers bound to
	// that hostname serve the namespace, only they are candidates
	// (hostname-aware bindings, R-LS-4); otherwise it does not matter.
	Host string
}

// excludes reports whether a live row of session sid at epoch is placed
// anew rather than returned (Exclude, ExcludeEpoch).
func (req *PlaceRequest) excludes(sid string, epoch uint64) bool {
	return sid != "" && sid == req.Exclude && (req.ExcludeEpoch == 0 || epoch == req.ExcludeEpoch)
}

// excludeArg is Exclude for the claim script: "<sid>", or "<sid> <epoch>"
// (a row's own form) with ExcludeEpoch.
func (req *PlaceRequest) excludeArg() string {
	if req.Exclude == "" || req.ExcludeEpoch == 0 {
		return req.Exclude
	}
	return req.Exclude + " " + strconv.FormatUint(req.ExcludeEpoch, 10)
}

var (
	// ErrUnknownNamespace: no live worker serves the namespace (R-PL-5).
	ErrUnknownNamespace = errors.New("unknown namespace")
	// ErrNoEligible: workers serve the namespace, but all are draining,
	// degraded or excluded.
	ErrNoEligible = errors.New("no eligible worker")
	// ErrUnknownSession: the session is unknown or its lease lapsed.
	ErrUnknownSession = errors.New("unknown session")
	// ErrForbidden: the session belongs to another account.
	ErrForbidden = errors.New("session belongs to another account")
	// ErrNoPlacement: nothing owns the id.
	ErrNoPlacement = errors.New("no placement")
	// ErrOwnerChanged: the id is owned by another session than the one
	// the caller named (WindDown).
	ErrOwnerChanged = errors.New("placement owner changed")
	// ErrUnavailable wraps store transport failures.
	ErrUnavailable = errors.New("directory unavailable")
	// ErrRefused: Redis answered the directory's connection with an error
	// no retry mends (a wrong password or user, an ACL denying a command
	// the directory needs, a database index out of range): REDIS_URL or
	// the server's configuration must change (OpenRedis).
	ErrRefused = errors.New("redis refused the directory's connection")
)

// SupersededError: a hostname-aware binding {hostname}{ns} belongs to a
// registration at a higher epoch (R-LS-4). Register returns it for a stale
// registration; Session and Heartbeat return it for a session displaced by
// a newer one, whose records were dropped.
type SupersededError struct {
	Hostname, NS, Env string // the binding {Hostname}{NS}, and the env it binds NS to now
	// Epoch is the registration epoch that holds the binding now.
	Epoch int64
	// ClientID is the displaced session's client, for logs (not on the
	// wire).
	ClientID string
}

// Error is the heartbeat reference's superseded message. The epoch is
// written as the reference writes a number in a string (JavaScript's
// Number#toString): the shortest decimal that reads back as the same
// double, so past 2^53 a nanosecond timestamp ends in zeros
// (1700000000223456768 is written 1700000000223456800), as %d did not.
// Epochs are doubles' values (the registry reads them as JSON.parse does),
// and below 10^21 JavaScript uses no exponent, as 'f' does not.
func (e *SupersededError) Error() string {
	return fmt.Sprintf("registration superseded: %s%s now bound to env %s at epoch %s", e.Hostname, e.NS, e.Env, FormatEpoch(e.Epoch))
}

// FormatEpoch writes a registration epoch as the reference writes the
// number (SupersededError.Error): logs name it as the 409 body and the
// workers listing do.
func FormatEpoch(epoch int64) string { return strconv.FormatFloat(float64(epoch), 'f', -1, 64) }

// QuarantineError is returned by Place during the cold-start quarantine.
type QuarantineError struct {
	// Remaining is how long until placements resume: one lease after the
	// first placement attempt since the start or wipe. Always positive.
	Remaining time.Duration
}

// Error is the data plane's 503 message: the remaining quarantine in
// whole milliseconds, rounded up.
func (e *QuarantineError) Error() string {
	ms := (e.Remaining + time.Millisecond - 1) / time.Millisecond
	return fmt.Sprintf("cold start: placements resume in %dms", ms)
}
