package proxy

import (
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
