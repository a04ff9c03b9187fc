package registry

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// workerView is one entry of GET /registry/workers (R-REG-4).
type workerView struct {
	ClientID       string   `json:"clientId"`
	SessionID      string   `json:"sessionId"`
	AdvertiseURL   string   `json:"advertiseUrl"`
	Namespaces     []string `json:"namespaces"`
	Headroom       float64  `json:"headroom"`
	Draining       bool     `json:"draining"`
	OperatorDrain  bool     `json:"operatorDrain"`
	DrainDeadline  *float64 `json:"drainDeadline,omitempty"`
	Degraded       bool     `json:"degraded"`
	DegradedSince  *int64   `json:"degradedSince,omitempty"`
	ExpiresInMs    int64    `json:"expiresInMs"`
	LeaseExpiresAt int64    `json:"leaseExpiresAt"`
	RegisteredAt   int64    `json:"registeredAt"`
	// Placements counts the session's placements in every namespace it
	// serves; it is left out for a credential that covers only some of
	// them, which must not learn how busy other tenants keep the worker.
	Placements *int   `json:"placements,omitempty"`
	Hostname   string `json:"hostname,omitempty"`
	Env        string `json:"env,omitempty"`
	// Epoch is the registration epoch as the reference lists it: a
	// JavaScript number (directory.FormatEpoch), absent when zero.
	Epoch json.Number `json:"epoch,omitempty"`
}

// workers handles GET /registry/workers: live sessions whose namespaces the
// credential's claims cover, with only the covered namespaces listed
// (R-TR-3, R-REG-4).
func (r *Registry) workers(ctx *fasthttp.RequestCtx) {
	pr := r.principal(ctx, attest.ScopeOperator)
	if pr == nil {
		return
	}
	c, cancel := r.opContext()
	defer cancel()
	now := r.now()
	list, err := r.store.Workers(c, now)
	if err != nil {
		r.storeFailed(ctx, "workers", err)
		return
	}
	out := struct {
		Workers []workerView `json:"workers"`
	}{Workers: make([]workerView, 0, len(list))}
	for i := range list {
		s := &list[i]
		var covered []string
		for _, ns := range s.Namespaces {
			if operatorCovers(pr, s, ns) {
				covered = append(covered, ns)
			}
		}
		if len(covered) == 0 {
			continue
		}
		w := workerView{
			ClientID:       s.ClientID,
			SessionID:      s.SessionID,
			AdvertiseURL:   s.AdvertiseURL,
			Namespaces:     covered,
			Headroom:       jsZero(s.Headroom),
			Draining:       s.Draining || s.Drain.Draining,
			OperatorDrain:  s.Drain.Draining,
			Degraded:       s.Degraded,
			ExpiresInMs:    ms(s.LeaseUntil.Sub(now)),
			LeaseExpiresAt: s.LeaseUntil.UnixMilli(),
			RegisteredAt:   s.RegisteredAt.UnixMilli(),
			Hostname:       s.Hostname,
			Env:            s.Env,
			Epoch:          epochNumber(s.Epoch),
		}
		if len(covered) == len(s.Namespaces) {
			n := s.Placements
			w.Placements = &n
		}
		if s.Drain.Draining && !s.Drain.Deadline.IsZero() {
			d := seconds(s.Drain.Deadline.Sub(now))
			w.DrainDeadline = &d
		}
		if s.Degraded {
			t := s.DegradedSince.UnixMilli()
			w.DegradedSince = &t
		}
		out.Workers = append(out.Workers, w)
	}
	replyJSON(ctx, fasthttp.StatusOK, out)
}

// health handles GET /registry/health (R-REG-5).
func (r *Registry) health(ctx *fasthttp.RequestCtx) {
	pr := r.principal(ctx, attest.ScopeOperator)
	if pr == nil {
		return
	}
	c, cancel := r.opContext()
	defer cancel()
	now := r.now()
	q, err := r.store.Quarantine(c, now)
	if err != nil {
		r.storeFailed(ctx, "health", err)
		return
	}
	ws, err := r.store.Workers(c, now)
	if err != nil {
		r.storeFailed(ctx, "health", err)
		return
	}
	// Counted as GET /registry/workers lists them: a credential learns
	// nothing of sessions outside its claims (R-TR-3).
	n := 0
	for i := range ws {
		if slices.ContainsFunc(ws[i].Namespaces, func(ns string) bool { return operatorCovers(pr, &ws[i], ns) }) {
			n++
		}
	}
	replyJSON(ctx, fasthttp.StatusOK, struct {
		OK           bool   `json:"ok"`
		Store        string `json:"store"`
		QuarantineMs int64  `json:"quarantineMs"`
		LeaseTTLMs   int64  `json:"leaseTtlMs"`
		Workers      int    `json:"workers"`
	}{true, r.store.Name(), ms(q), r.ttl.Milliseconds(), n})
}

// operatorCovers reports whether an operator's claims reach session s's
// namespace ns (R-TR-3): the namespace, and the hostname and env the
// session binds it to, as a registration's claims must cover them
// (coverage). An operator key limited to staging's env neither sees nor
// drains production's workers.
func operatorCovers(pr *attest.Principal, s *directory.SessionInfo, ns string) bool {
	return coverage(pr, []string{ns}, s.Hostname, directory.EnvOf(s.Env, s.Envs, ns), nil) == ""
}

// ownedPlacement reads the placement of ns/id for an operator call op and
// checks the credential reaches its owner (reachesOwner); it answers
// 404/403/503 itself and reports success.
func (r *Registry) ownedPlacement(ctx *fasthttp.RequestCtx, c context.Context, pr *attest.Principal, ns, id string, now time.Time, op string) (*directory.PlacementInfo, bool) {
	p, err := r.store.Placement(c, ns, id, now)
	var ok bool
	if err == nil {
		ok, err = reachesOwner(c, r.store, pr, ns, p, now)
	}
	switch {
	case errors.Is(err, directory.ErrNoPlacement):
		reply(ctx, fasthttp.StatusNotFound, bodyNoPlacement)
	case err != nil:
		r.storeFailed(ctx, op, err)
	case !ok:
		reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
	default:
		return p, true
	}
	return nil, false
}

// reachesOwner reports whether the credential reaches the owner of
// placement p of ns as operatorCovers does. A placement whose owner is
// gone has no hostname or env to check: only a credential that covers
// them all reaches it.
func reachesOwner(c context.Context, store directory.Store, pr *attest.Principal, ns string, p *directory.PlacementInfo, now time.Time) (bool, error) {
	info, err := store.Session(c, p.SessionID, now)
	switch {
	case sessionGone(err):
		return pr.Claims.CoversAll(), nil
	case err != nil:
		return false, err
	}
	return operatorCovers(pr, info, ns), nil
}

// operatorFor checks the credential covers every namespace the client's
// live sessions serve; it answers 404/403/503 itself and reports success.
// An undrain may also name a client with no live session (its drain
// outlives sessions), when the credential covers every namespace: the
// store then says whether there was a drain to clear.
func (r *Registry) operatorFor(ctx *fasthttp.RequestCtx, pr *attest.Principal, clientID string, undrain bool) bool {
	c, cancel := r.opContext()
	defer cancel()
	list, err := r.store.Workers(c, r.now())
	if err != nil {
		r.storeFailed(ctx, "drain", err)
		return false
	}
	found := false
	for i := range list {
		if list[i].ClientID != clientID {
			continue
		}
		found = true
		for _, ns := range list[i].Namespaces {
			if !operatorCovers(pr, &list[i], ns) {
				reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
				return false
			}
		}
	}
	if !found && !(undrain && pr.Claims.CoversAll()) {
		reply(ctx, fasthttp.StatusNotFound, bodyUnknownClient)
		return false
	}
	return true
}

// maxDeadline bounds operator drain and wind-down deadlines (seconds): a
// week covers any deploy, and keeps the arithmetic far from overflow.
const maxDeadline = 7 * 24 * 3600

// drain handles POST /registry/drain {clientId, deadline?} (R-REG-6): no new
// placements on the client's sessions; with deadline (seconds) a timed
// drain whose placements are force-released at the deadline, while the
// lease stops advancing past deadline plus one lease (R-LS-5).
func (r *Registry) drain(ctx *fasthttp.RequestCtx) {
	var body struct {
		ClientID *string  `json:"clientId"`
		Deadline *float64 `json:"deadline"`
	}
	pr := r.clientRequest(ctx, &body, &body.ClientID, bodyDrainShape)
	if pr == nil {
		return
	}
	now := r.now()
	state := directory.DrainState{Draining: true}
	if body.Deadline != nil {
		s := *body.Deadline
		if s < 0 || s > maxDeadline {
			reply(ctx, fasthttp.StatusBadRequest, bodyDeadlineRange)
			return
		}
		state.Deadline = now.Add(time.Duration(s * float64(time.Second)))
	}
	r.setDrain(ctx, pr, *body.ClientID, state, now)
}

// undrain handles POST /registry/undrain {clientId} (R-REG-6).
func (r *Registry) undrain(ctx *fasthttp.RequestCtx) {
	var body struct {
		ClientID *string `json:"clientId"`
	}
	pr := r.clientRequest(ctx, &body, &body.ClientID, bodyUndrainShape)
	if pr == nil {
		return
	}
	r.setDrain(ctx, pr, *body.ClientID, directory.DrainState{}, r.now())
}

// clientRequest reads the body of an operator request about one client
// (drain, undrain) into v, whose clientId field is *clientID. It answers
// the request itself and returns nil unless an operator sent it (401,
// 403), the body decodes (413, 400) and it names a client (400 with
// shape); otherwise it returns the operator.
func (r *Registry) clientRequest(ctx *fasthttp.RequestCtx, v any, clientID **string, shape []byte) *attest.Principal {
	pr := r.principal(ctx, attest.ScopeOperator)
	if pr == nil {
		return nil
	}
	if !r.readJSON(ctx, v, shape) {
		return nil
	}
	if *clientID == nil || **clientID == "" {
		reply(ctx, fasthttp.StatusBadRequest, shape)
		return nil
	}
	return pr
}

func (r *Registry) setDrain(ctx *fasthttp.RequestCtx, pr *attest.Principal, clientID string, state directory.DrainState, now time.Time) {
	if !r.operatorFor(ctx, pr, clientID, !state.Draining) {
		return
	}
	c, cancel := r.opContext()
	defer cancel()
	found, err := r.store.SetDrain(c, clientID, state, now)
	if err != nil {
		r.storeFailed(ctx, "drain", err)
		return
	}
	if !found {
		reply(ctx, fasthttp.StatusNotFound, bodyUnknownClient)
		return
	}
	out := struct {
		ClientID      string   `json:"clientId"`
		Draining      bool     `json:"draining"`
		DrainDeadline *float64 `json:"drainDeadline,omitempty"`
	}{ClientID: clientID, Draining: state.Draining}
	var deadline any // the seconds, not the *float64: a text log prints a pointer's address
	if !state.Deadline.IsZero() {
		d := seconds(state.Deadline.Sub(now))
		out.DrainDeadline = &d
		deadline = d
	}
	r.log.Info("drain", "clientId", clientID, "draining", state.Draining, "by", "operator", "deadline", deadline)
	replyJSON(ctx, fasthttp.StatusOK, out)
}

// windDown handles POST /registry/wind-down {namespace, id, deadline}
// (R-CM-1): queue a wind_down for the id's owner; deadline null revokes.
func (r *Registry) windDown(ctx *fasthttp.RequestCtx) {
	pr := r.principal(ctx, attest.ScopeOperator)
	if pr == nil {
		return
	}
	var body struct {
		Namespace *string         `json:"namespace"`
		ID        *string         `json:"id"`
		Deadline  json.RawMessage `json:"deadline"`
	}
	if !r.readJSON(ctx, &body, bodyWindDownShape) {
		return
	}
	if body.Namespace == nil || body.ID == nil || len(body.Deadline) == 0 || !instanceName(*body.Namespace, *body.ID) {
		reply(ctx, fasthttp.StatusBadRequest, bodyWindDownShape)
		return
	}
	if !pr.Claims.CoversNamespace(*body.Namespace) {
		reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
		return
	}
	now := r.now()
	var deadline *time.Time
	if string(body.Deadline) != "null" {
		var s float64
		if err := json.Unmarshal(body.Deadline, &s); err != nil {
			reply(ctx, fasthttp.StatusBadRequest, bodyWindDownShape)
			return
		}
		if s < 0 || s > maxDeadline {
			reply(ctx, fasthttp.StatusBadRequest, bodyDeadlineRange)
			return
		}
		t := now.Add(time.Duration(s * float64(time.Second)))
		deadline = &t
	}
	c, cancel := r.opContext()
	defer cancel()
	var msgID, sid string
	var err error
	// The owner checked is the owner wound down: a placement that moved
	// between the check and the queueing (released and placed again, or
	// reclaimed by a re-registration) may be on a worker the credential
	// does not reach, so the store refuses it and the check runs again.
	for range windDownTries {
		p, ok := r.ownedPlacement(ctx, c, pr, *body.Namespace, *body.ID, now, "wind-down")
		if !ok {
			return
		}
		msgID, sid, err = r.store.WindDown(c, *body.Namespace, *body.ID, p.SessionID, deadline, now)
		if !errors.Is(err, directory.ErrOwnerChanged) {
			break
		}
	}
	switch {
	case errors.Is(err, directory.ErrOwnerChanged):
		replyRetry(ctx, bodyOwnerMoving, 1)
		return
	case errors.Is(err, directory.ErrNoPlacement):
		reply(ctx, fasthttp.StatusNotFound, bodyNoPlacement)
		return
	case err != nil:
		r.storeFailed(ctx, "wind-down", err)
		return
	}
	r.log.Info("wind-down", "namespace", *body.Namespace, "id", *body.ID, "sessionId", sid, "msgId", msgID, "revoke", deadline == nil)
	replyJSON(ctx, fasthttp.StatusOK, struct {
		MsgID     string `json:"msgId"`
		SessionID string `json:"sessionId"`
	}{msgID, sid})
}

// windDownTries bounds the checks of a wind-down whose id keeps moving
// to another owner between the check and the queueing.
const windDownTries = 3

// instanceName reports whether ns and id can name an instance: ns one a
// worker may register (namespaceRE), id one the data plane routes
// (directory.CheckID). Neither holds a NUL, which the stores put between
// the two: "/c\0x" and "y" made the key of "/c" and "x\0y".
func instanceName(ns, id string) bool {
	return namespaceRE.MatchString(ns) && directory.CheckID(id) == nil
}

// placement handles GET /registry/placement?namespace=&id=: which worker
// owns an id.
func (r *Registry) placement(ctx *fasthttp.RequestCtx) {
	pr := r.principal(ctx, attest.ScopeOperator)
	if pr == nil {
		return
	}
	args := ctx.QueryArgs()
	ns, id := string(args.Peek("namespace")), string(args.Peek("id"))
	if !instanceName(ns, id) {
		reply(ctx, fasthttp.StatusBadRequest, bodyPlacementShape)
		return
	}
	if !pr.Claims.CoversNamespace(ns) {
		reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
		return
	}
	c, cancel := r.opContext()
	defer cancel()
	now := r.now()
	p, ok := r.ownedPlacement(ctx, c, pr, ns, id, now, "placement")
	if !ok {
		return
	}
	replyJSON(ctx, fasthttp.StatusOK, struct {
		Namespace    string `json:"namespace"`
		ID           string `json:"id"`
		SessionID    string `json:"sessionId"`
		ClientID     string `json:"clientId"`
		AdvertiseURL string `json:"advertiseUrl"`
		Epoch        string `json:"epoch"`
		Live         bool   `json:"live"`
	}{p.NS, p.ID, p.SessionID, p.ClientID, p.Advertise, formatEpoch(p.Epoch), p.Live})
}

// formatEpoch renders an epoch as the decimal string the release body and
// the pinboard-epoch header carry (JavaScript numbers lose precision past
// 2^53).
func formatEpoch(e uint64) string { return strconv.FormatUint(e, 10) }

// epochNumber is a listed registration epoch: none for zero (a worker
// that declared none), else as the reference writes it.
func epochNumber(e int64) json.Number {
	if e == 0 {
		return ""
	}
	return json.Number(directory.FormatEpoch(e))
}

// jsZero is f with -0 read as 0: a worker may report a headroom of -0
// (JSON allows it), and the reference lists it as JSON.stringify writes
// it, 0, where Go's encoder writes -0. Go and JavaScript write every other
// number alike.
func jsZero(f float64) float64 {
	if f == 0 {
		return 0
	}
	return f
}
