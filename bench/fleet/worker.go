package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Worker is one virtual worker. Its identity (ClientID, Secret,
// AdvertiseURL) is fixed; its session and challenge change as it registers
// and heartbeats.
type Worker struct {
	Index        int
	ClientID     string
	Secret       string
	AdvertiseURL string

	fleet  *Fleet
	secret []byte
	st     atomic.Pointer[wstate]
	// verified caches the last accepted attestation (see verify).
	verified atomic.Pointer[verifiedToken]
	// leaving is set when Leave begins: the worker is off the listing
	// at once (its session is gone, so nothing may be sent to it for
	// the baselines), and serves requests until left, after the grace.
	leaving atomic.Bool
	left    atomic.Bool

	stopOnce sync.Once
	stop     chan struct{}

	// Owned by the worker's loop goroutine (and by registration before the
	// loop starts).
	prevSession string
	acks        []string
	superseded  bool
}

// wstate is replaced whole, so a probe always sees a challenge and value
// minted together.
type wstate struct {
	session   string
	challenge string
	value     string
}

// Session is the current session id, "" before registration.
func (w *Worker) Session() string { return w.st.Load().session }

// SetSession installs a session without registering (unit tests).
func (w *Worker) SetSession(id string) {
	s := *w.st.Load()
	s.session = id
	w.st.Store(&s)
}

// Challenge is the current challenge and its value.
func (w *Worker) Challenge() (challenge, value string) {
	s := w.st.Load()
	return s.challenge, s.value
}

// rotate mints a fresh challenge pair before a register or heartbeat
// (the reference does so before sending, so its probe answers the pair
// the request carries).
func (w *Worker) rotate(session string) *wstate {
	s := &wstate{session: session, challenge: randomHex(16), value: randomHex(16)}
	w.st.Store(s)
	return s
}

func (w *Worker) stopLoop() { w.stopOnce.Do(func() { close(w.stop) }) }

// loop heartbeats at a fixed rate anchored at send time, like the
// reference, re-registering when pinboard forgets the session.
func (w *Worker) loop(ctx context.Context, offset time.Duration) {
	f := w.fleet
	t := time.NewTimer(offset)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.stop:
			return
		case <-f.closed:
			return
		case <-t.C:
		}
		started := time.Now()
		if w.superseded {
			return
		}
		if !f.paused.Load() {
			if w.Session() == "" {
				_ = w.register(ctx)
			} else {
				w.heartbeat(ctx)
			}
		}
		t.Reset(max(0, f.o.Heartbeat-time.Since(started)))
	}
}

type registerBody struct {
	ClientID       string   `json:"clientId"`
	Secret         string   `json:"secret"`
	Namespaces     []string `json:"namespaces"`
	AdvertiseURL   string   `json:"advertiseUrl"`
	Headroom       float64  `json:"headroom"`
	Draining       bool     `json:"draining"`
	Challenge      string   `json:"challenge"`
	ChallengeValue string   `json:"challengeValue"`
	PrevSessionID  string   `json:"prevSessionId,omitempty"`
}

type ackBody struct {
	SessionID   string  `json:"sessionId"`
	ExpiresInMs float64 `json:"expiresInMs"`
	Degraded    bool    `json:"degraded"`
	Reregister  bool    `json:"reregister"`
	Superseded  bool    `json:"superseded"`
	Error       string  `json:"error"`
	Messages    []struct {
		MsgID string `json:"msgId"`
		Type  string `json:"type"`
	} `json:"messages"`
}

// errDeferred: pinboard asked to retry (503 with Retry-After).
type errDeferred struct{ after time.Duration }

func (e *errDeferred) Error() string { return "registration deferred" }

// registerUntil registers, retrying deferrals and transport errors until
// ctx ends.
func (w *Worker) registerUntil(ctx context.Context) error {
	f := w.fleet
	select {
	case f.regSema <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-f.regSema }()
	for {
		err := w.register(ctx)
		if err == nil {
			return nil
		}
		wait := 200 * time.Millisecond
		var d *errDeferred
		if errors.As(err, &d) {
			wait = d.after
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cannot register worker %d: %w (last: %v)", w.Index, ctx.Err(), err)
		case <-f.closed:
			return errors.New("fleet closed")
		case <-time.After(wait):
		}
	}
}

func (w *Worker) register(ctx context.Context) error {
	f := w.fleet
	if f.pb == nil {
		return errors.New("fleet has no pinboard URL")
	}
	st := w.rotate("")
	body, err := json.Marshal(registerBody{
		ClientID: w.ClientID, Secret: w.Secret, Namespaces: f.o.Namespaces,
		AdvertiseURL: w.AdvertiseURL, Headroom: f.o.Headroom,
		Challenge: st.challenge, ChallengeValue: st.value, PrevSessionID: w.prevSession,
	})
	if err != nil {
		return err
	}
	var ack ackBody
	status, retry, err := f.post(ctx, "/registry/register", body, &ack)
	f.stats.register(status, err)
	switch {
	case err != nil:
		return err
	case status == fasthttp.StatusServiceUnavailable:
		return &errDeferred{after: retry}
	case status != fasthttp.StatusOK || ack.SessionID == "":
		return fmt.Errorf("register answered %d: %s", status, ack.Error)
	}
	w.prevSession = ""
	w.acks = w.acks[:0]
	s := *w.st.Load()
	s.session = ack.SessionID
	w.st.Store(&s)
	return nil
}

// heartbeat sends one heartbeat (003_d935a1d8ec89be7a.txt) with a fresh
// challenge and the acks of messages applied since the last 200.
func (w *Worker) heartbeat(ctx context.Context) {
	f := w.fleet
	session := w.Session()
	st := w.rotate(session)
	body := make([]byte, 0, 256)
	body = append(body, `{"sessionId":"`...)
	body = append(body, session...)
	body = append(body, `","headroom":`...)
	body = strconv.AppendFloat(body, f.o.Headroom, 'g', -1, 64)
	body = append(body, `,"draining":false,"challenge":"`...)
	body = append(body, st.challenge...)
	body = append(body, `","challengeValue":"`...)
	body = append(body, st.value...)
	body = append(body, '"')
	sent := len(w.acks)
	if sent > 0 {
		body = append(body, `,"acks":[`...)
		for i, a := range w.acks {
			if i > 0 {
				body = append(body, ',')
			}
			body = strconv.AppendQuote(body, a)
		}
		body = append(body, ']')
	}
	body = append(body, '}')
	start := time.Now()
	var ack ackBody
	status, _, err := f.post(ctx, "/registry/heartbeat", body, &ack)
	f.stats.heartbeat(time.Since(start), status, err, ack.Degraded, sent)
	switch {
	case err != nil:
		return
	case status == fasthttp.StatusOK:
		// Acked messages are trimmed; the new ones are applied (a virtual
		// worker holds no instances) and acked next time.
		w.acks = append(w.acks[:0], w.acks[sent:]...)
		for _, m := range ack.Messages {
			w.acks = append(w.acks, m.MsgID)
		}
		f.stats.messages.Add(uint64(len(ack.Messages)))
	case status == fasthttp.StatusConflict && ack.Superseded:
		w.superseded = true
	case status == fasthttp.StatusConflict && ack.Reregister:
		w.prevSession = session
		w.SetSession("")
	}
}

func (w *Worker) deregister(ctx context.Context) error {
	f := w.fleet
	session := w.Session()
	if f.pb == nil || session == "" {
		return nil
	}
	body := []byte(`{"sessionId":"` + session + `"}`)
	status, _, err := f.post(ctx, "/registry/deregister", body, nil)
	if err != nil {
		return err
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("deregister answered %d", status)
	}
	return nil
}

// post sends a JSON body to pinboard and decodes the answer into out.
func (f *Fleet) post(ctx context.Context, path string, body []byte, out any) (status int, retry time.Duration, err error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(f.pbBase + path)
	req.Header.SetHost(f.pb.Addr)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set(fasthttp.HeaderAuthorization, f.auth)
	req.SetBodyRaw(body)
	timeout := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	if err := f.pb.DoTimeout(req, resp, timeout); err != nil {
		return 0, 0, err
	}
	status = resp.StatusCode()
	retry = time.Second
	if s, err := strconv.Atoi(string(resp.Header.Peek(fasthttp.HeaderRetryAfter))); err == nil && s > 0 {
		retry = time.Duration(s) * time.Second
	}
	if out != nil && len(resp.Body()) > 0 {
		_ = json.Unmarshal(resp.Body(), out)
	}
	return status, retry, nil
}
