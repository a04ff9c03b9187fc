package fleet

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/bench"
)

// testClock is a settable clock for attestation windows.
type testClock struct{ now time.Time }

func (c *testClock) Now() time.Time { return c.now }

func newTestFleet(t *testing.T, clock *testClock) *Fleet {
	t.Helper()
	f, err := New(Options{Workers: 2, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ln := fasthttputil.NewInmemoryListener()
	f.Serve(ln, 9999)
	t.Cleanup(func() { _ = f.Close(t.Context()) })
	return f
}

// do runs one request through the fleet's handler.
func do(f *Fleet, method, uri string, headers map[string]string) (int, string) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(uri)
	for k, v := range headers {
		ctx.Request.Header.Set(k, v)
	}
	f.Handle(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

func mint(secret, aud string, iat int64) string {
	return string(attest.AppendAttestation(nil, &attest.AttestationInput{
		Secret: []byte(secret), Aud: aud, IssuedAt: iat, Depth: attest.NoDepth,
	}))
}

func TestAdvertiseURLs(t *testing.T) {
	f := newTestFleet(t, &testClock{now: time.Unix(1_800_000_000, 0)})
	for i, w := range f.Workers() {
		want := "http://127.0.0.1:9999/w/" + string(rune('0'+i)) + "/"
		if w.AdvertiseURL != want || w.Index != i || len(w.Secret) != 64 || len(w.ClientID) != 32 {
			t.Fatalf("unexpected worker %d; got %+v; want advertise URL %s", i, w, want)
		}
	}
}

// TestChallengeProbe: the probe needs the proxy secret (or an
// attestation), then the current challenge; it answers the current value.
func TestChallengeProbe(t *testing.T) {
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	f := newTestFleet(t, clock)
	w := f.Worker(1)
	st := w.rotate("")
	uri := "/w/1/_pinned/challenge?challenge=" + st.challenge

	if code, body := do(f, "GET", uri, nil); code != 403 || body != `{"detail":"invalid proxy secret"}` {
		t.Fatalf("unexpected answer without the secret; got %d %s", code, body)
	}
	if code, _ := do(f, "GET", uri, map[string]string{hdrProxySecret: f.Worker(0).Secret}); code != 403 {
		t.Fatalf("unexpected answer with another worker's secret; got %d; want 403", code)
	}
	secret := map[string]string{hdrProxySecret: w.Secret}
	if code, body := do(f, "GET", "/w/1/_pinned/challenge?challenge=stale", secret); code != 404 || body != `{"detail":"unknown challenge"}` {
		t.Fatalf("unexpected answer to a stale challenge; got %d %s", code, body)
	}
	code, body := do(f, "GET", uri, secret)
	var got struct{ Value string }
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil || got.Value != st.value {
		t.Fatalf("unexpected probe answer; got %d %s; want value %s", code, body, st.value)
	}
	// A rotation (the next heartbeat) retires the old pair.
	next := w.rotate("")
	if code, _ := do(f, "GET", uri, secret); code != 404 {
		t.Fatalf("unexpected answer to the previous challenge after rotation; got %d; want 404", code)
	}
	if next.challenge == st.challenge || next.value == st.value {
		t.Fatal("unexpected reuse of a challenge pair")
	}
	// The reference's _verify_probe also accepts an attestation.
	w.SetSession("sess-1")
	att := map[string]string{hdrAttestation: mint(w.Secret, "sess-1", clock.now.Unix())}
	if code, _ := do(f, "GET", "/w/1/_pinned/challenge?challenge="+next.challenge, att); code != 200 {
		t.Fatalf("unexpected answer to an attested probe; got %d; want 200", code)
	}
	if code, _ := do(f, "POST", "/w/1/_pinned/challenge?challenge="+next.challenge, secret); code != 405 {
		t.Fatalf("unexpected answer to a POST probe; got %d; want 405", code)
	}
}

// TestAttestationRequired: instance routes answer 403 "invalid
// attestation" unless the token verifies for the worker's session, exactly
// as attest.VerifyAttestation decides — also on the cached path.
func TestAttestationRequired(t *testing.T) {
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	f := newTestFleet(t, clock)
	w := f.Worker(0)
	uri := "/w/0/bench/alice/json"
	hdr := func(tok string) map[string]string { return map[string]string{hdrAttestation: tok} }
	now := clock.now.Unix()

	if code, body := do(f, "GET", uri, nil); code != 403 || body != `{"detail":"invalid attestation"}` {
		t.Fatalf("unexpected answer before registration; got %d %s", code, body)
	}
	valid := mint(w.Secret, "sess-a", now)
	if code, _ := do(f, "GET", uri, hdr(valid)); code != 403 {
		t.Fatalf("unexpected answer without a session; got %d; want 403", code)
	}
	w.SetSession("sess-a")
	for name, tok := range map[string]string{
		"missing":        "",
		"other audience": mint(w.Secret, "sess-b", now),
		"other secret":   mint(f.Worker(1).Secret, "sess-a", now),
		"expired":        mint(w.Secret, "sess-a", now-61),
		"future":         mint(w.Secret, "sess-a", now+31),
		"tampered":       tamper(valid),
		"garbage":        "a.b.c",
	} {
		if code, _ := do(f, "GET", uri, hdr(tok)); code != 403 {
			t.Fatalf("unexpected answer to a %s attestation; got %d; want 403", name, code)
		}
	}
	for i := 0; i < 2; i++ { // the second use hits the cache
		code, body := do(f, "GET", uri, hdr(valid))
		if code != 200 || body != `{"ns":"/bench","id":"alice","worker":0}` {
			t.Fatalf("unexpected answer to a valid attestation (use %d); got %d %s", i+1, code, body)
		}
	}
	// The cached token expires like any other: exp+30 s is the last second.
	clock.now = time.Unix(now+60, 0)
	if code, _ := do(f, "GET", uri, hdr(valid)); code != 200 {
		t.Fatalf("unexpected answer at exactly exp+skew; got %d; want 200", code)
	}
	clock.now = time.Unix(now+60, 1)
	if code, _ := do(f, "GET", uri, hdr(valid)); code != 403 {
		t.Fatalf("unexpected answer just past exp+skew from the cache; got %d; want 403", code)
	}
	// A new session retires the cached token at once.
	clock.now = time.Unix(now, 0)
	w.SetSession("sess-c")
	if code, _ := do(f, "GET", uri, hdr(valid)); code != 403 {
		t.Fatalf("unexpected answer to the old session's token; got %d; want 403", code)
	}
	// Every accept and reject above agrees with the reference verifier.
	for _, tok := range []string{valid, mint(w.Secret, "sess-c", now)} {
		_, err := attest.VerifyAttestation(tok, []byte(w.Secret), []string{"sess-c"}, clock.now)
		code, _ := do(f, "GET", uri, hdr(tok))
		if (err == nil) != (code == 200) {
			t.Fatalf("unexpected disagreement with VerifyAttestation; got %d with err %v", code, err)
		}
	}
}

func TestRoutesAndUnknownWorkers(t *testing.T) {
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	f := newTestFleet(t, clock)
	w := f.Worker(1)
	w.SetSession("s")
	hdr := map[string]string{hdrAttestation: mint(w.Secret, "s", clock.now.Unix())}
	for uri, want := range map[string]int{
		"/w/1/bench/x/json":                 200,
		"/w/1/bench/x/nope":                 404,
		"/w/1/bench/x":                      404,
		"/w/7/bench/x/json":                 404,
		"/w/bench/x/json":                   404,
		"/x/1/bench/x/json":                 404,
		"/w/1/bench/x/download?size=100000": 200,
	} {
		if code, _ := do(f, "GET", uri, hdr); code != want {
			t.Fatalf("unexpected status for %s; got %d; want %d", uri, code, want)
		}
	}
	w.left.Store(true)
	if code, _ := do(f, "GET", "/w/1/bench/x/json", hdr); code != 404 {
		t.Fatalf("unexpected answer from a worker that left; got %d; want 404", code)
	}
}

func TestSSEChunk(t *testing.T) {
	got := string(appendSSEChunk(nil, 1700000000123456789, 7))
	want := "1d\r\ndata: 1700000000123456789 7\n\n\r\n"
	if got != want {
		t.Fatalf("unexpected chunk; got %q; want %q", got, want)
	}
	if !strings.HasSuffix(sseHeader, "\r\n\r\n") {
		t.Fatal("unexpected SSE header ending")
	}
}

func TestSplitInstance(t *testing.T) {
	ns, id, action, ok := splitInstance([]byte("/bench/alice/json"))
	if !ok || string(ns) != "/bench" || string(id) != "alice" || string(action) != "json" {
		t.Fatalf("unexpected split; got %q %q %q %v", ns, id, action, ok)
	}
	for _, p := range []string{"", "/", "//a/b", "/ns//b", "/ns/id", "ns/id/a"} {
		if _, _, _, ok := splitInstance([]byte(p)); ok {
			t.Fatalf("unexpected split of %q", p)
		}
	}
}

func TestStatsSnapshotKeepsTheDistribution(t *testing.T) {
	s := newStats()
	for i := 1; i <= 100; i++ {
		s.heartbeat(time.Duration(i)*time.Millisecond, 200, nil, i == 50, 0)
	}
	s.heartbeat(time.Second, 0, errors.New("boom"), false, 0)
	snap := s.Snapshot(true)
	if snap.Heartbeats != 101 || snap.ByStatus["200"] != 100 || snap.ByStatus["transport"] != 1 || snap.Degraded != 1 {
		t.Fatalf("unexpected counts; got %+v", snap)
	}
	if snap.AckP99us < 99_000 || snap.AckP99us > 100_000 {
		t.Fatalf("unexpected ack p99; got %vµs; want 99ms", snap.AckP99us)
	}
	h := bench.HistOf(snap.AckHist)
	if h.Count() != 100 {
		t.Fatalf("unexpected stored distribution; got %d values; want 100", h.Count())
	}
	if again := s.Snapshot(false); again.Heartbeats != 0 || len(again.AckHist) != 0 {
		t.Fatalf("unexpected counters after a reset; got %+v", again)
	}
}

// tamper changes one character of tok's signature, well before its end:
// replacing the last two with "AA" left the token as it was when the
// signature already ended so (about one run in a thousand, the secret
// being random), and the tampered token was rightly accepted.
func tamper(tok string) string {
	b := []byte(tok)
	i := len(b) - 5
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
