package proxy

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
)

// Client-supplied attestation headers never reach the worker, whatever
// their spelling, number or padding, on every path a request takes: a
// plain request, a streamed (chunked) upload with the header also sent as
// a trailer, an event stream, a WebSocket handshake and an attested
// cluster call (R-TR-5). The worker gets exactly one attestation,
// pinboard's, which verifies for its session.
func TestClientAttestationStrippedOnEveryPath_RTR5(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var mu sync.Mutex
	var got [][]string // the Pinboard-Attestation values of each request the worker got
	record := func(r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("Pinboard-Attestation"))
		mu.Unlock()
	}
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		record(r)
		rw.WriteHeader(http.StatusTeapot)
	})
	w.route("/echo", func(rw http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 512)
		for {
			if _, err := r.Body.Read(buf); err != nil {
				break
			}
		}
		record(r)
		for k, v := range r.Trailer {
			if strings.HasPrefix(strings.ToLower(k), "pinboard") {
				t.Errorf("unexpected trailer %s: %q at the worker; want none", k, v)
			}
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte("data: ok\n\n"))
	})
	// One forgery looks like pinboard's own: minted for the session, with
	// a key that is not the worker's.
	lookalike := string(attest.AppendAttestation(nil, &attest.AttestationInput{
		Secret: []byte("not-the-secret"), Aud: w.session.Load().(string), IssuedAt: time.Now().Unix(), Depth: attest.NoDepth}))
	forged := "pinboard-attestation: forged-lower\r\n" +
		"PINBOARD-ATTESTATION:   forged-upper   \r\n" +
		"Pinboard-Attestation:\tforged-tab\r\n" +
		"Pinboard-Attestation: " + lookalike + "\r\n"
	call := "Pinboard-Session: " + w.session.Load().(string) + "\r\n" +
		"Pinboard-Session-Secret: " + w.secret + "\r\nPinboard-From: /counters/alice\r\n"
	paths := map[string]string{
		"request": "GET /counters/a1/echo HTTP/1.1\r\nHost: x\r\n" + forged + "Connection: close\r\n\r\n",
		"chunked upload with a trailer": "POST /counters/a2/echo HTTP/1.1\r\nHost: x\r\n" + forged +
			"Transfer-Encoding: chunked\r\nTrailer: Pinboard-Attestation\r\nConnection: close\r\n\r\n" +
			"3\r\nabc\r\n0\r\nPinboard-Attestation: forged-trailer\r\n\r\n",
		"event stream":    "GET /counters/a3/echo HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n" + forged + "Connection: close\r\n\r\n",
		"cluster call":    "GET /counters/a4/echo HTTP/1.1\r\nHost: x\r\n" + call + forged + "Connection: close\r\n\r\n",
		"websocket":       strings.Replace(upgradeRequest("/counters/a5/ws"), "Host: x\r\n", "Host: x\r\n"+forged, 1),
		"websocket, call": strings.Replace(upgradeRequest("/counters/a6/ws"), "Host: x\r\n", "Host: x\r\n"+call+forged, 1),
	}
	for name, req := range paths {
		mu.Lock()
		got = nil
		mu.Unlock()
		res := rg.raw(req, 10*time.Second)
		if !strings.HasPrefix(res, "HTTP/1.1 200") && !strings.HasPrefix(res, "HTTP/1.1 418") {
			t.Errorf("%s: unexpected answer; got %q; want the worker's own (a 403 means a forged copy came first)", name, res)
			continue
		}
		mu.Lock()
		vals := got
		mu.Unlock()
		if len(vals) != 1 || len(vals[0]) != 1 || strings.Contains(vals[0][0], "forged") || vals[0][0] == lookalike {
			t.Errorf("%s: unexpected Pinboard-Attestation at the worker; got %q; want exactly pinboard's own", name, vals)
			continue
		}
		if _, err := attest.VerifyAttestation(vals[0][0], []byte(w.secret), []string{w.session.Load().(string)}, time.Now()); err != nil {
			t.Errorf("%s: unexpected attestation at the worker; got %v; want pinboard's, valid for the session", name, err)
		}
	}
}

// A request that waited for a worker connection (the pool full, up to
// PINBOARD_UPSTREAM_CONN_WAIT_MS) goes out with an attestation minted when
// it went out, not when it started waiting: the worker accepts one for
// 30 s past its exp (iat + 30 s, R-TR-5), and a streamed upload that had
// waited longer was answered the worker's 403 "invalid attestation" — a
// body read as it streams cannot be sent again, so the session-gap retry
// did not save it.
func TestAttestationMintedWhenRequestGoesOut_RTR5(t *testing.T) {
	rg := newRig(t, func(o *Options) {
		o.Upstream.MaxConns = 1
		o.Upstream.ConnWait = time.Minute
	})
	rg.warm()
	w := newStandin(t, "w")
	hold, held := make(chan struct{}), make(chan struct{})
	// The worker verifies with the rig's clock, which the test moves.
	w.srv.Config.Handler = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/hold") {
			close(held)
			select { // bounded: a failed test must not hang the server's Close
			case <-hold:
			case <-time.After(30 * time.Second):
			}
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if _, err := attest.VerifyAttestation(r.Header.Get("pinboard-attestation"), []byte(w.secret), []string{w.session.Load().(string)}, rg.now()); err != nil {
			rw.WriteHeader(http.StatusForbidden)
			_, _ = rw.Write([]byte(`{"detail":"invalid attestation"}`))
			return
		}
		_, _ = rw.Write([]byte("ok"))
	})
	rg.add(w, 1, "/counters")
	first := make(chan string, 1)
	go func() { first <- rg.raw("GET /counters/a/hold HTTP/1.1\r\nHost: x\r\n\r\n", 30*time.Second) }()
	select { // the one connection is busy
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected wait: the first request did not reach the worker within 10s")
	}
	second := make(chan string, 1)
	go func() {
		second <- rg.raw("POST /counters/b/up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 30*time.Second)
	}()
	waitUntil(t, "the upload to wait for the connection", func() bool {
		u, err := rg.p.ups.get(w.srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		p := u.pool
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.waiters == 1
	})
	rg.advance(2 * time.Minute) // past the window of an attestation minted before
	close(hold)
	<-first
	if res := <-second; !strings.HasPrefix(res, "HTTP/1.1 200") || !strings.HasSuffix(res, "ok") {
		t.Fatalf("unexpected answer to the upload that waited for the connection; got %q; want 200 ok: its attestation must be minted when it goes out", res)
	}
}
