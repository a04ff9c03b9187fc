package directory

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

var (
	errShortReply = errors.New("unexpected script reply")
	errOwnerGone  = errors.New("owner deregistered during the claim")
)

// replyErr is why a script's reply cannot be used: err when the call
// failed (a network error, a cancelled context, a script error), and
// errShortReply only when it answered something else than the script
// returns, so that an outage is not reported as a bad reply.
func replyErr(err error) error {
	if err != nil {
		return err
	}
	return errShortReply
}

// Session implements Store.
func (r *Redis) Session(ctx context.Context, sessionID string, now time.Time) (*SessionInfo, error) {
	reply, err := r.run(ctx, "session", scriptSession, r.key("s", sessionID), []string{r.prefix, micros(now), sessionID}).AsStrSlice()
	if err != nil {
		return nil, unavailable("read session", sessionID, err)
	}
	if err := goneErr(reply); err != nil {
		r.kill(sessionID)
		return nil, err
	}
	info, ok := decodeInfo(reply[1:])
	if !ok || reply[0] != "ok" {
		return nil, unavailable("read session", sessionID, errShortReply)
	}
	r.beats.put(&info)
	return &info, nil
}

// Heartbeat implements Store.
func (r *Redis) Heartbeat(ctx context.Context, beat *Beat, now time.Time) (*BeatResult, error) {
	args := make([]string, 0, 9+len(beat.Acks))
	args = append(args, r.prefix, micros(now), r.leaseMicros(), beat.SessionID, beat.Sub,
		strconv.FormatFloat(beat.Headroom, 'g', -1, 64), flag(beat.Draining), flag(beat.Degraded), r.queueMillis())
	args = append(args, beat.Acks...)
	reply, err := r.run(ctx, "heartbeat", scriptHeartbeat, r.key("s", beat.SessionID), args).AsStrSlice()
	if err != nil {
		return nil, unavailable("renew session", beat.SessionID, err)
	}
	if err := goneErr(reply); err != nil {
		// Redis says the session is over: end it here too, rather than
		// route to it until the lease this node last read runs low.
		r.kill(beat.SessionID)
		return nil, err
	}
	switch {
	case len(reply) > 0 && reply[0] == "forbidden":
		return nil, ErrForbidden
	case len(reply) < 7 || reply[0] != "ok":
		return nil, unavailable("renew session", beat.SessionID, errShortReply)
	}
	res := &BeatResult{
		LeaseUntil:  fromMicros(reply[1]),
		Draining:    reply[2] == "1",
		Drain:       DrainState{Draining: reply[3] == "1", Deadline: fromMicros(reply[4])},
		WasDraining: reply[5] == "1",
		WasDegraded: reply[6] == "1",
	}
	if s := r.session(beat.SessionID); s != nil {
		s.setLease(res.LeaseUntil)
	}
	r.beats.renew(beat.SessionID, res.LeaseUntil, beat.Degraded)
	for _, m := range reply[7:] {
		if cm, ok := decodeMessage(m); ok {
			res.Messages = append(res.Messages, cm)
		}
	}
	return res, nil
}

// Void implements Store. The session is gone once the first script call
// returns (its record dropped, its rows dead-owner rows any claim
// re-places); its rows are then freed RegisterBatch per call (drop).
func (r *Redis) Void(ctx context.Context, sessionID string, _ time.Time) error {
	return r.drop(ctx, "deregister", sessionID, false, nil)
}

// drop runs redis_drop.lua for sid until none of its rows is left: the
// first call drops the session (when it still exists) and each frees at
// most one batch of its rows, so other clients' commands run between
// them (docs/DIRECTORY.md, "Scripts"). freed, when not nil, gets the rows
// each call freed. A failed call leaves the session gone and the rest of
// its rows listed for the sweep, which finishes the drop. displacer is
// set by the registration that superseded or voided sid while its batches
// follow (redis_drop.lua): no sweep frees those rows unseen by it.
func (r *Redis) drop(ctx context.Context, op, sid string, displacer bool, freed func(rows []string)) error {
	return r.inBatches(math.MaxInt, func() (bool, error) {
		reply, err := r.runWrite(ctx, op, scriptDrop, r.key("s", sid), []string{r.prefix, sid, flag(displacer)}).ToArray()
		if err != nil || len(reply) < 2 {
			return false, unavailable("drop session", sid, replyErr(err))
		}
		rows := strs(arr(reply[0]))
		r.forget(r.rowKeys(rows))
		r.kill(sid)
		if freed != nil {
			freed(rows)
		}
		more, _ := reply[1].AsInt64()
		return more != 0, nil
	})
}

// inBatches runs step, one script call that frees one batch of dropped
// rows and reports whether more is left, until it reports none or has
// run limit times, running afterDrop in between (memory_drop.go does the
// same under the memory store's lock).
func (r *Redis) inBatches(limit int, step func() (bool, error)) error {
	for i := range limit {
		if i > 0 && r.afterDrop != nil {
			r.afterDrop()
		}
		if more, err := step(); err != nil || !more {
			return err
		}
	}
	return nil
}

// Deregister implements Store.
func (r *Redis) Deregister(ctx context.Context, sessionID string, now time.Time) error {
	return r.Void(ctx, sessionID, now)
}

// Release implements Store.
func (r *Redis) Release(ctx context.Context, req *ReleaseRequest, now time.Time) (bool, error) {
	n, err := r.ReleaseBatch(ctx, []ReleaseRequest{*req}, now)
	return n == 1, err
}

// ReleaseBatch implements Store: one script call, one round trip, per
// RegisterBatch rows (redis_release_batch.lua). A release per call cost a
// round trip per row: a worker's batch of 9,000 took 9 s across a 1 ms
// link, past the worker's HTTP timeout and the operation timeout.
func (r *Redis) ReleaseBatch(ctx context.Context, reqs []ReleaseRequest, _ time.Time) (int, error) {
	n := 0
	args := make([]string, 0, 1+3*min(len(reqs), RegisterBatch))
	for start := 0; start < len(reqs); start += RegisterBatch {
		chunk := reqs[start:min(start+RegisterBatch, len(reqs))]
		args = append(args[:0], r.prefix)
		for i := range chunk {
			args = append(args, chunk[i].SessionID, strconv.FormatUint(chunk[i].Epoch, 10), rowName(chunk[i].NS, chunk[i].ID))
		}
		rows, err := r.runWrite(ctx, "release", scriptReleaseBatch, r.rowKey(chunk[0].NS, chunk[0].ID), args).AsStrSlice()
		if err != nil {
			return n, unavailable("release", chunk[0].NS+"/"+chunk[0].ID, err)
		}
		r.forget(r.rowKeys(rows))
		n += len(rows)
	}
	return n, nil
}

// Workers implements Store.
func (r *Redis) Workers(ctx context.Context, now time.Time) ([]SessionInfo, error) {
	list, err := r.run(ctx, "workers", scriptWorkers, r.prefix+"leases", []string{r.prefix, micros(now)}).ToArray()
	if err != nil {
		return nil, unavailable("list", "workers", err)
	}
	out := make([]SessionInfo, 0, len(list))
	for i := range list {
		if info, ok := decodeInfo(strs(arr(list[i]))); ok {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b SessionInfo) int {
		if c := a.RegisteredAt.Compare(b.RegisteredAt); c != 0 {
			return c
		}
		return strings.Compare(a.SessionID, b.SessionID)
	})
	return out, nil
}

// Expired implements ExpiredCounter: the lease index's sessions whose
// lease is not after now (drops remove theirs; the sweep removes the rest
// one lease later).
func (r *Redis) Expired(ctx context.Context, now time.Time) (int, error) {
	start := time.Now()
	n, err := r.c.Do(ctx, r.c.B().Zcount().Key(r.prefix+"leases").Min("-inf").Max(micros(now)).Build()).AsInt64()
	r.observe("expired", start, err)
	if err != nil {
		return 0, unavailable("count", "expired sessions", err)
	}
	return int(n), nil
}

// SetDrain implements Store.
func (r *Redis) SetDrain(ctx context.Context, clientID string, drain DrainState, now time.Time) (bool, error) {
	deadline := "0"
	if drain.Draining && !drain.Deadline.IsZero() {
		deadline = micros(drain.Deadline)
	}
	reply, err := r.run(ctx, "drain", scriptDrain, r.key("k", clientID), []string{r.prefix, micros(now),
		r.leaseMicros(), clientID, flag(drain.Draining), deadline}).AsStrSlice()
	if err != nil || len(reply) == 0 {
		return false, unavailable("drain", clientID, replyErr(err))
	}
	for i := 1; i+1 < len(reply); i += 2 {
		if s := r.session(reply[i]); s != nil {
			s.setLease(fromMicros(reply[i+1]))
		}
	}
	return reply[0] == "1", nil
}

// WindDown implements Store.
func (r *Redis) WindDown(ctx context.Context, ns, id, owner string, deadline *time.Time, now time.Time) (string, string, error) {
	msgID := NewMsgID()
	msg := encodeMessage(ControlMessage{MsgID: msgID, Type: "wind_down", NS: ns, ID: id, Deadline: deadline})
	at := ""
	if deadline != nil {
		at = micros(*deadline)
	}
	sid, err := r.run(ctx, "wind_down", scriptWindDown, r.rowKey(ns, id), []string{r.prefix, micros(now), msg, r.queueMillis(), at, rowName(ns, id), owner}).ToString()
	if rueidis.IsRedisNil(err) {
		return "", "", ErrNoPlacement
	}
	if err != nil {
		return "", "", unavailable("wind down", ns+"/"+id, err)
	}
	if owner != "" && sid != owner {
		return "", "", ErrOwnerChanged // the script queued nothing
	}
	return msgID, sid, nil
}

// Placement implements Store.
func (r *Redis) Placement(ctx context.Context, ns, id string, now time.Time) (*PlacementInfo, error) {
	reply, err := r.run(ctx, "placement", scriptPlacement, r.rowKey(ns, id), []string{r.prefix}).AsStrSlice()
	if rueidis.IsRedisNil(err) {
		return nil, ErrNoPlacement
	}
	if err != nil || len(reply) < 5 {
		return nil, unavailable("read placement", ns+"/"+id, replyErr(err))
	}
	ep, _ := strconv.ParseUint(reply[1], 10, 64)
	return &PlacementInfo{
		NS: ns, ID: id,
		SessionID: reply[0], Epoch: ep, ClientID: reply[2], Advertise: reply[3],
		Live: now.Before(fromMicros(reply[4])),
	}, nil
}

// Quarantine implements Store. The stamp is read through the client cache:
// it changes only when the directory is wiped, and a wipe flushes caches.
func (r *Redis) Quarantine(ctx context.Context, now time.Time) (time.Duration, error) {
	start := time.Now()
	// Every readiness probe and scrape reads the stamp.
	res := r.c.DoCache(ctx, r.c.B().Get().Key(r.prefix+"stamp").Cache(), cacheTTL)
	r.observeCached("quarantine", start, res)
	v, err := res.ToString()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("read", "cold-start stamp", err)
	}
	// now as the claim script compares it (micros rounds up): never more
	// than one lease after the first attempt (R-CS-1).
	rem := fromMicros(v).Add(r.ttl).Sub(fromMicros(micros(now)))
	return max(rem, 0), nil
}

// Sweep implements Store. One script call drops at most sweepBatch dead
// sessions and frees at most RegisterBatch rows, continuing earlier drops
// and forced releases of timed drains (R-LS-5) that have rows left; Sweep
// calls again until nothing is left (or maxSweepCalls, the next sweep
// goes on), so neither a dead session nor a drained one holding many rows
// holds Redis for long. A sweep cut short leaves the rest to the next
// sweep of any node.
func (r *Redis) Sweep(ctx context.Context, now time.Time) error {
	err := r.inBatches(maxSweepCalls, func() (bool, error) {
		reply, err := r.runWrite(ctx, "sweep", scriptSweep, r.prefix+"leases", []string{r.prefix, micros(now),
			r.leaseMicros(), strconv.Itoa(sweepBatch)}).ToArray()
		if err != nil || len(reply) < 3 {
			return false, unavailable("sweep", "directory", replyErr(err))
		}
		r.forget(r.rowKeys(strs(arr(reply[0]))))
		dropped := strs(arr(reply[1]))
		for _, sid := range dropped {
			r.kill(sid)
		}
		more, _ := reply[2].AsInt64()
		return more != 0 || len(dropped) >= sweepBatch, nil
	})
	r.beats.prune(now, r.ttl)
	return err
}

func (r *Redis) rowKeys(rows []string) []string {
	keys := make([]string, len(rows))
	for i, row := range rows {
		keys[i] = r.prefix + "p:" + row
	}
	return keys
}

// queueMillis is the control queue's expiry after its last use (R-CM-1).
func (r *Redis) queueMillis() string {
	return strconv.FormatInt((queueLeases * r.ttl).Milliseconds(), 10)
}

// goneErr reads the gone() reply of redis_lib.lua: a superseded session
// (R-LS-4) or an unknown one; nil for anything else.
func goneErr(reply []string) error {
	switch {
	case len(reply) == 1 && reply[0] == "unknown":
		return ErrUnknownSession
	case len(reply) == 6 && reply[0] == "superseded":
		ep, _ := strconv.ParseInt(reply[4], 10, 64)
		return &SupersededError{Hostname: reply[1], NS: reply[2], Env: reply[3], Epoch: ep, ClientID: reply[5]}
	}
	return nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
