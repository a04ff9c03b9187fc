package registry

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// releaseItem is one entry of POST /registry/release. The reference worker
// (RegistrationClient._post_release) sends a JSON array of these, with the
// placement epoch as a decimal string.
type releaseItem struct {
	SessionID *string `json:"sessionId"`
	Namespace *string `json:"namespace"`
	ID        *string `json:"id"`
	Epoch     *string `json:"epoch"`
}

// release handles POST /registry/release (R-REG-3): idle eviction frees
// the placement so the next request re-places it. A body may be an array
// (what workers send) or a single object.
func (r *Registry) release(ctx *fasthttp.RequestCtx) {
	pr := r.principal(ctx, attest.ScopeWorker)
	if pr == nil {
		return
	}
	b, ok := r.bodyOrReply(ctx)
	if !ok {
		return
	}
	var items []releaseItem
	var err error
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var one releaseItem
		err = decode(b, &one)
		items = []releaseItem{one}
	} else {
		err = decode(b, &items)
	}
	if err != nil {
		replyDecodeError(ctx, err, bodyReleaseShape)
		return
	}
	// The body limit (1 MiB, R-REG-7) bounds the items, and nothing else
	// may: the worker (RegistrationClient._flush_releases) sends every
	// release queued behind the one in flight as one array, and retries a
	// refused batch unchanged before dropping it.
	if items == nil { // the body was null
		reply(ctx, fasthttp.StatusBadRequest, bodyReleaseShape)
		return
	}
	reqs := make([]directory.ReleaseRequest, 0, len(items))
	for _, it := range items {
		if it.SessionID == nil || it.Namespace == nil || it.ID == nil {
			reply(ctx, fasthttp.StatusBadRequest, bodyReleaseShape)
			return
		}
		rr := directory.ReleaseRequest{SessionID: *it.SessionID, NS: *it.Namespace, ID: *it.ID}
		if it.Epoch != nil {
			e, err := strconv.ParseUint(*it.Epoch, 10, 64)
			if err != nil || e == 0 {
				reply(ctx, fasthttp.StatusBadRequest, bodyReleaseShape)
				return
			}
			rr.Epoch = e
		}
		reqs = append(reqs, rr)
	}
	c, cancel := r.opContext()
	defer cancel()
	now := r.now()
	// Only the account that registered a session may free its rows. Every
	// session is checked before anything is freed: a batch naming another
	// account's session is refused whole, not after freeing the items
	// before it.
	owners := map[string]bool{}
	for i := range reqs {
		sid := reqs[i].SessionID
		if _, seen := owners[sid]; seen {
			continue
		}
		info, err := r.store.Session(c, sid, now)
		switch {
		case sessionGone(err):
			owners[sid] = false // lapsed or superseded: its rows are re-placeable anyway
		case err != nil:
			r.storeFailed(ctx, "release", err)
			return
		case info.Sub != pr.Sub:
			reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
			return
		default:
			owners[sid] = true
		}
	}
	// One batch to the store, not a call per item: a worker's batch of
	// thousands (a drain's idle evictions) was a round trip per item, past
	// the worker's 5 s timeout with the store a millisecond away, and each
	// retry stopped where the first did.
	live := reqs[:0]
	for _, rr := range reqs {
		if owners[rr.SessionID] {
			live = append(live, rr)
		}
	}
	released, err := r.store.ReleaseBatch(c, live, now)
	if err != nil {
		r.storeFailed(ctx, "release", err)
		return
	}
	replyJSON(ctx, fasthttp.StatusOK, struct {
		Released int `json:"released"`
	}{released})
}

// deregister handles POST /registry/deregister (R-REG-3): a plain shutdown
// ends the session and frees its placements. Unknown sessions answer 200:
// the worker retries deregister and must not loop on a session that is
// already gone.
func (r *Registry) deregister(ctx *fasthttp.RequestCtx) {
	pr := r.principal(ctx, attest.ScopeWorker)
	if pr == nil {
		return
	}
	var body struct {
		SessionID *string `json:"sessionId"`
	}
	if !r.readJSON(ctx, &body, bodyDeregisterShape) {
		return
	}
	if body.SessionID == nil {
		reply(ctx, fasthttp.StatusBadRequest, bodyDeregisterShape)
		return
	}
	c, cancel := r.opContext()
	defer cancel()
	now := r.now()
	info, err := r.store.Session(c, *body.SessionID, now)
	switch {
	case sessionGone(err):
		replyJSON(ctx, fasthttp.StatusOK, struct {
			OK bool `json:"ok"`
		}{true})
		return
	case err != nil:
		r.storeFailed(ctx, "deregister", err)
		return
	case info.Sub != pr.Sub:
		reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
		return
	}
	if err := r.store.Deregister(c, info.SessionID, now); err != nil {
		r.storeFailed(ctx, "deregister", err)
		return
	}
	r.log.Info("deregister", "clientId", info.ClientID, "sessionId", info.SessionID, "placements", info.Placements)
	replyJSON(ctx, fasthttp.StatusOK, struct {
		OK bool `json:"ok"`
	}{true})
}

// sessionGone: the session has no records left to free — its lease
// lapsed, or a higher epoch superseded it (R-LS-4 drops its records). A
// superseded worker still releases each instance it aborts and
// deregisters at shutdown, retrying what fails; those calls succeed
// with nothing to do rather than answer 503 as if the store were down.
func sessionGone(err error) bool {
	var se *directory.SupersededError
	return errors.Is(err, directory.ErrUnknownSession) || errors.As(err, &se)
}
