package registry

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A heartbeat while the Redis directory is paused (SIGSTOP: it closes
// nothing and answers nothing) is answered 503 directory unavailable with
// Retry-After, byte for byte as for any store failure (R-REG-2, R-DP-4) —
// at once once the node holds Redis silent, where each one waited for the
// registry's whole operation timeout before — and the same session's
// heartbeat is acked again when Redis resumes, without a re-registration.
func TestHeartbeatWhileRedisPaused_RREG2(t *testing.T) {
	srv := redistest.StartServer(t)
	const budget = time.Second
	h := &harness{t: t, now: time.Unix(1_800_000_000, 0), fw: newFakeWorker(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := directory.OpenRedis(ctx, srv.URL(), directory.RedisOptions{LeaseTTL: testTTL, Prefix: "paused", Staleness: budget})
	if err != nil {
		t.Fatalf("cannot open the redis directory: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	h.ds = s
	h.r = h.registry(testPassport(t))
	session := h.register(nil)
	want := `{"expiresInMs":15000,"draining":false}`
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != want {
		t.Fatalf("unexpected reply; got %d %s; want 200 %s", res.status, res.body, want)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			_ = srv.Resume()
		}
	}()
	const unavailable = `{"error":"directory unavailable"}`
	pausedAt := time.Now()
	for {
		start := time.Now()
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		took := time.Since(start)
		if res.status != 503 || res.body != unavailable || string(res.header.Peek("Retry-After")) != "1" {
			t.Fatalf("unexpected heartbeat while redis is paused; got %d %s (Retry-After %q); want 503 %s with Retry-After 1",
				res.status, res.body, res.header.Peek("Retry-After"), unavailable)
		}
		if took < budget/2 {
			t.Logf("heartbeats answered at once %v into the pause", time.Since(pausedAt).Round(time.Millisecond))
			break
		}
		if time.Since(pausedAt) > 20*time.Second {
			t.Fatalf("unexpected wait: heartbeats still wait for a redis paused %v (the last %v); want 503 at once", time.Since(pausedAt).Round(time.Millisecond), took)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	paused = false
	resumed := time.Now()
	for {
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.status == 200 && res.body == want {
			break
		}
		if res.status != 503 || time.Since(resumed) > 20*time.Second {
			t.Fatalf("unexpected heartbeat %v after redis resumed; got %d %s; want 200 %s", time.Since(resumed), res.status, res.body, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// While the directory is down every heartbeat fails: each logged its own
// "registry operation failed" line, 3,333 a second through each node for
// 10,000 workers on 3 s heartbeats. One line a second now, with the number
// of failures it stands for; every heartbeat is still answered 503 with
// Retry-After (R-REG-7).
func TestStoreFailuresLoggedOncePerSecond_RREG7(t *testing.T) {
	h := newHarness(t)
	ds := &downStore{Memory: h.store}
	logs := &testlog.Buffer{}
	r, err := New(Options{Store: ds, Passport: testPassport(t), LeaseTTL: testTTL, Now: h.clock, ProbeTimeout: time.Second,
		Workers: 4, Queue: 16, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(time.Second) })
	h.r = r
	s := h.register(nil)
	ds.down.Store(true)
	beat := func() {
		t.Helper()
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(s, nil))
		if res.status != 503 || res.body != `{"error":"directory unavailable"}` || string(res.header.Peek("Retry-After")) != "1" {
			t.Fatalf("unexpected heartbeat while the directory is down; got %d %s; want 503 directory unavailable with Retry-After 1", res.status, res.body)
		}
	}
	for range 50 {
		beat()
	}
	h.advance(time.Second)
	beat()
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var failed []string
	for _, l := range lines {
		if strings.Contains(l, "registry operation failed") {
			failed = append(failed, l)
		}
	}
	if len(failed) != 2 || !strings.Contains(failed[0], "notLogged=0") || !strings.Contains(failed[1], "notLogged=49") {
		t.Fatalf("unexpected failure lines for 50 failed heartbeats in one second and one in the next; got %q; want two, the second with notLogged=49", failed)
	}
}
