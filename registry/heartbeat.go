package registry

import (
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// heartbeatBody is POST /registry/heartbeat (003_d935a1d8ec89be7a.txt).
type heartbeatBody struct {
	SessionID      *string  `json:"sessionId"`
	Headroom       *float64 `json:"headroom"`
	Draining       *bool    `json:"draining"`
	Challenge      *string  `json:"challenge"`
	ChallengeValue *string  `json:"challengeValue"`
	// Acks holds pointers so that a null element, a schema failure, is
	// told from "", a string (acks is string[]).
	Acks ackList `json:"acks,omitzero"`
}

// ackList is the heartbeat's acks as sent. "acks": null is no string[]
// either, and refused like [null]; a *[]*string field leaves nil for it
// and for an absent key alike, and null passed for "no acks".
type ackList struct {
	list *[]*string
	null bool
}

// MarshalJSON writes the list as it was read (tests round-trip bodies).
func (a ackList) MarshalJSON() ([]byte, error) {
	if a.null {
		return []byte("null"), nil
	}
	return json.Marshal(a.list)
}

// UnmarshalJSON keeps the last of a key given twice, as JSON.parse does:
// "acks":null then "acks":[""] is a string[].
func (a *ackList) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		a.null, a.list = true, nil
		return nil
	}
	a.null = false
	return json.Unmarshal(b, &a.list)
}

// heartbeatAck is the 200 response; optional fields appear only when the
// reference says so.
type heartbeatAck struct {
	ExpiresInMs   int64        `json:"expiresInMs"`
	Draining      bool         `json:"draining"`
	DrainDeadline *float64     `json:"drainDeadline,omitempty"`
	Degraded      bool         `json:"degraded,omitempty"`
	Messages      []ackMessage `json:"messages,omitempty"`
}

// ackMessage is a control message on the wire (R-CM-1). Deadline is
// always present: a number of seconds from delivery, or null to revoke.
type ackMessage struct {
	MsgID    string   `json:"msgId"`
	Type     string   `json:"type"`
	NS       string   `json:"ns"`
	ID       string   `json:"id"`
	Deadline *float64 `json:"deadline"`
}

// heartbeat handles POST /registry/heartbeat (R-REG-2, R-LS-1..3, R-CM-1):
// it checks the request and looks the session up, then hands the
// challenge probe to ServeHTTP (probeCall); beat goes on with its result.
func (r *Registry) heartbeat(ctx *fasthttp.RequestCtx) *probeCall {
	start := time.Now()
	pr, body, info, known, outcome := r.checkHeartbeat(ctx)
	if info == nil {
		r.obs.Heartbeat(time.Since(start), outcome)
		return nil
	}
	return &probeCall{
		offPool: info.Degraded,
		url:     info.AdvertiseURL, secret: info.Secret, challenge: *body.Challenge, value: *body.ChallengeValue,
		then: func(ctx *fasthttp.RequestCtx, res ProbeResult, perr error) {
			r.obs.Heartbeat(time.Since(start), r.beat(ctx, pr, body, info, known, res, perr))
		},
	}
}

// checkHeartbeat answers every error row that comes before the probe
// (credentials, body, session) and returns the session to probe, or nil
// and the outcome. known: the session is what the store's node knew of
// it (directory.KnownSessions), not read from the store for this
// heartbeat.
func (r *Registry) checkHeartbeat(ctx *fasthttp.RequestCtx) (pr *attest.Principal, body *heartbeatBody, info *directory.SessionInfo, known bool, outcome string) {
	pr = r.principal(ctx, attest.ScopeWorker)
	if pr == nil {
		return nil, nil, nil, false, "auth"
	}
	body = &heartbeatBody{}
	if !r.readJSON(ctx, body, bodyHeartbeatShape) {
		return nil, nil, nil, false, "bad_request"
	}
	if body.SessionID == nil || body.Headroom == nil || body.Draining == nil || body.Challenge == nil || body.ChallengeValue == nil ||
		!token(*body.Challenge) || !token(*body.ChallengeValue) || // as at register
		body.Acks.null || (body.Acks.list != nil && slices.Contains(*body.Acks.list, nil)) { // null, [null]
		reply(ctx, fasthttp.StatusBadRequest, bodyHeartbeatShape)
		return nil, nil, nil, false, "bad_request"
	}
	// A session this node saw live, its lease still running, is not read
	// again: its identity never changes, and the heartbeat's own step
	// re-checks the session (unknown, superseded, forbidden) where it
	// renews. On Redis that is one round trip per heartbeat instead of two
	// (docs/DIRECTORY.md, "Heartbeats").
	if ks, ok := r.store.(directory.KnownSessions); ok {
		info, known = ks.KnownSession(*body.SessionID, r.now())
	}
	if known && covers(pr, info) {
		return pr, body, info, true, ""
	}
	// Read from the store: a session the node does not know, and a known
	// one the credential does not cover — one that ended meanwhile
	// (through another node) is answered as it ended, 409 before 403, as
	// when it was read before this check.
	if info, outcome = r.readSession(ctx, *body.SessionID); info == nil {
		return nil, nil, nil, false, outcome
	}
	if !covers(pr, info) {
		reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
		return nil, nil, nil, false, "forbidden"
	}
	return pr, body, info, false, ""
}

// covers reports whether pr may heartbeat the session: same account, and
// its claims still cover the registration, advertise URL included
// (R-TR-3): a passport that narrowed the key ends its sessions at hosts
// it may no longer register.
func covers(pr *attest.Principal, info *directory.SessionInfo) bool {
	return info.Sub == pr.Sub && coverage(pr, info.Namespaces, info.Hostname, info.Env, info.Envs) == "" &&
		pr.Claims.CheckBackend(info.AdvertiseURL) == nil
}

// readSession reads a heartbeat's session from the store, or answers why
// not (409 superseded, 409 unknown session, 503) and returns nil and the
// outcome.
func (r *Registry) readSession(ctx *fasthttp.RequestCtx, sid string) (*directory.SessionInfo, string) {
	c, cancel := r.opContext()
	defer cancel()
	info, err := r.store.Session(c, sid, r.now())
	if err != nil {
		return nil, r.sessionFailed(ctx, sid, err)
	}
	return info, ""
}

// sessionFailed answers a heartbeat whose session the store did not find
// or renew: 409 superseded (logged), 409 unknown session, else 503; it
// returns the outcome.
func (r *Registry) sessionFailed(ctx *fasthttp.RequestCtx, sid string, err error) string {
	var se *directory.SupersededError
	if errors.As(err, &se) {
		r.log.Warn("superseded", "clientId", se.ClientID, "sessionId", sid, "hostname", se.Hostname, "namespace", se.NS, "env", se.Env, "epoch", directory.FormatEpoch(se.Epoch))
		reply(ctx, fasthttp.StatusConflict, supersededBody(se))
		return "superseded"
	}
	if errors.Is(err, directory.ErrUnknownSession) {
		reply(ctx, fasthttp.StatusConflict, bodyUnknownSession)
		return "unknown_session"
	}
	r.storeFailed(ctx, "heartbeat", err)
	return "unavailable"
}

// beat applies a probed heartbeat: void on a mismatch, else renew the
// lease (degraded when the probe failed) and answer the ack.
func (r *Registry) beat(ctx *fasthttp.RequestCtx, pr *attest.Principal, body *heartbeatBody, info *directory.SessionInfo, known bool, res ProbeResult, perr error) string {
	c, cancel := r.opContext()
	defer cancel()
	headroom := *body.Headroom
	if res == ProbeMismatch {
		// The URL reaches another process: this registration is void. A
		// session the node only knew of is read first: one that ended
		// meanwhile (through another node) is answered as it ended, not
		// voided, as when it was read before the probe.
		if known {
			fresh, outcome := r.readSession(ctx, info.SessionID)
			if fresh == nil {
				return outcome
			}
			info = fresh
		}
		now := r.now()
		if err := r.store.Void(c, info.SessionID, now); err != nil {
			r.storeFailed(ctx, "void", err)
			return "unavailable"
		}
		r.log.Warn("voided", "clientId", info.ClientID, "sessionId", info.SessionID, "advertiseUrl", info.AdvertiseURL)
		reply(ctx, fasthttp.StatusConflict, bodyVoided)
		return "voided"
	}
	degraded := res != ProbeOK
	var acks []string
	if body.Acks.list != nil {
		acks = make([]string, len(*body.Acks.list))
		for i, a := range *body.Acks.list {
			acks[i] = *a
		}
	}
	now := r.now()
	out, err := r.store.Heartbeat(c, &directory.Beat{
		SessionID: info.SessionID,
		Sub:       pr.Sub,
		Headroom:  headroom,
		Draining:  *body.Draining,
		Degraded:  degraded,
		Acks:      acks,
	}, now)
	switch {
	case errors.Is(err, directory.ErrForbidden):
		reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
		return "forbidden"
	case err != nil:
		return r.sessionFailed(ctx, info.SessionID, err)
	}
	// Transitions are logged from the state the store replaced, read in
	// the same step: once per change, whichever node had the last beat.
	if degraded && !out.WasDegraded {
		r.log.Warn("degraded", "clientId", info.ClientID, "sessionId", info.SessionID, "advertiseUrl", info.AdvertiseURL, "probe", res.String(), "err", perr)
	} else if !degraded && out.WasDegraded {
		r.log.Info("recovered", "clientId", info.ClientID, "sessionId", info.SessionID)
	}
	if *body.Draining != out.WasDraining {
		r.log.Info("drain", "clientId", info.ClientID, "sessionId", info.SessionID, "draining", *body.Draining, "by", "worker")
	}
	ack := heartbeatAck{
		ExpiresInMs: ms(out.LeaseUntil.Sub(now)),
		Draining:    out.Draining,
		Degraded:    degraded,
	}
	if out.Drain.Draining && !out.Drain.Deadline.IsZero() {
		d := seconds(out.Drain.Deadline.Sub(now))
		ack.DrainDeadline = &d
	}
	if len(out.Messages) > 0 {
		ack.Messages = make([]ackMessage, len(out.Messages))
		for i, m := range out.Messages {
			am := ackMessage{MsgID: m.MsgID, Type: m.Type, NS: m.NS, ID: m.ID}
			if m.Deadline != nil {
				d := seconds(m.Deadline.Sub(now))
				am.Deadline = &d
			}
			ack.Messages[i] = am
		}
	}
	replyJSON(ctx, fasthttp.StatusOK, ack)
	if degraded {
		return "degraded"
	}
	return "ok"
}
