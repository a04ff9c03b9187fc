package registry

import (
	"context"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
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
