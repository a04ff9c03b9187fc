package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/metrics"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A malformed REDIS_URL is a configuration error: one line naming the
// variable, exit 2, nothing started (R-SRV-3). The password never shows.
func TestMalformedRedisURL_RSRV3(t *testing.T) {
	for _, u := range []string{
		"redis://:s3cret@127.0.0.1:notaport",
		"redis://127.0.0.1:6379/notadb",
		"redis://a:1,b:2",
		"redis+sentinel://127.0.0.1:26379",
		"redis+cluster://127.0.0.1:7000/3",
		"redis://127.0.0.1:6379?bogus=1",
		"ftp://127.0.0.1",
		// Without "://" the whole value was echoed, password included.
		"default:s3cret@127.0.0.1:6379",
		"redis:/:s3cret@127.0.0.1:6379",
	} {
		env := map[string]string{
			"PINBOARD_PASSPORT": `{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"TOK"},"scopes":["pinboard:worker"]}]}]}`,
			"TOK":               "t",
			"REDIS_URL":         u,
			"HOST":              "127.0.0.1",
			"PORT":              "0",
		}
		// loadConfig first: run given a URL it accepts would dial the
		// URL's hosts (a, b) and, the store open, serve for ever.
		if _, err := loadConfig(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err == nil {
			t.Errorf("%s: unexpected acceptance; got nil; want a REDIS_URL error", u)
			continue
		}
		var stderr bytes.Buffer
		code := run(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &stderr)
		out := stderr.String()
		if code != 2 {
			t.Errorf("%s: unexpected exit code; got %d; want 2 (%s)", u, code, out)
		}
		if !strings.HasPrefix(out, "pinboard: REDIS_URL: ") || strings.Count(out, "\n") != 1 {
			t.Errorf("%s: unexpected message; got %q; want one line naming REDIS_URL", u, out)
		}
		if strings.Contains(out, "s3cret") {
			t.Errorf("%s: unexpected password in %q", u, out)
		}
	}
}

// The Redis store's round trips reach the metrics (issue 6: Redis command
// latency): openStore hands the *metrics.Metrics to the store as its
// observer, so a scrape after a placement attempt shows the claim script's
// latency, and no error for the NOSCRIPT that a script's first EVALSHA on a
// server (or any after a Redis restart) answers.
func TestRedisCommandsMetered_RSRV3(t *testing.T) {
	store, m := meteredStore(t)
	// The first placement attempt stamps the cold start: one claim script.
	_, err := store.Place(t.Context(), &directory.PlaceRequest{NS: "/c", ID: "x", Now: time.Now()})
	var q *directory.QuarantineError
	if !errors.As(err, &q) {
		t.Fatalf("unexpected first placement; got %v; want the cold-start quarantine", err)
	}
	// The claim script had never run on this server: EVALSHA's NOSCRIPT
	// and the EVAL after it are two round trips, and no failure.
	wantExposed(t, m, "",
		`pinboard_store_command_duration_seconds_count{op="place.claim"} 2`,
		`pinboard_store_command_errors_total{op="place.claim"} 0`)
}

// meteredStore opens the Redis store on a server of its own as pinboard
// does, its round trips observed by the returned metrics, and closes it
// when the test ends.
func meteredStore(t *testing.T) (directory.Store, *metrics.Metrics) {
	t.Helper()
	srv := redistest.StartServer(t)
	m := metrics.New(metrics.Options{})
	store, err := openStore(t.Context(), &config{RedisURL: srv.URL(), LeaseTTL: time.Second}, slog.New(slog.DiscardHandler), m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.(io.Closer).Close() })
	return store, m
}

// wantExposed requires each of lines, whole, in m's exposition; note says
// why when they are missing.
func wantExposed(t *testing.T, m *metrics.Metrics, note string, lines ...string) {
	t.Helper()
	exp := string(m.AppendPrometheus(t.Context(), nil))
	for _, line := range lines {
		if !strings.Contains(exp, line+"\n") {
			t.Errorf("unexpected exposition without %q%s:\n%s", line, note, exp)
		}
	}
}

// pinboard_store_command_duration_seconds counts round trips to Redis
// (docs/OPERATIONS.md, Metrics): a read the client-side cache answers is
// none. The cold-start stamp is read through that cache by every /readyz
// probe and every scrape; each of those cache hits was recorded as a
// quarantine "round trip" of a microsecond, and the histogram of that
// operation showed the cache's speed rather than Redis's (R-SRV-3).
func TestRedisCacheHitsNotMeteredAsRoundTrips_RSRV3(t *testing.T) {
	store, m := meteredStore(t)
	for range 5 {
		if _, err := store.Quarantine(t.Context(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// A placement's cached read of the id's row, answered by the cache
	// from the second attempt on (the cold-start quarantine refuses them).
	for range 3 {
		_, err := store.Place(t.Context(), &directory.PlaceRequest{NS: "/c", ID: "x", Now: time.Now()})
		var q *directory.QuarantineError
		if !errors.As(err, &q) {
			t.Fatalf("unexpected placement; got %v; want the cold-start quarantine", err)
		}
	}
	wantExposed(t, m, " (one round trip, then cache hits)",
		`pinboard_store_command_duration_seconds_count{op="quarantine"} 1`,
		`pinboard_store_command_duration_seconds_count{op="place.read"} 1`)
}

// A Redis that refuses connections — down, restarting, not started yet at
// boot — failed the start at once (exit 1), where storeOpenTimeout is how
// long a start waits for the store: deploy/systemd's start limit counts on
// a failing start taking that long, and five refused starts RestartSec
// apart reached it within seconds and left pinboard failed for good once
// Redis was back. A Redis that comes up within the wait is reached
// (R-SRV-3).
func TestRedisRefusingAtStartIsWaitedFor_RSRV3(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Stop() // its port now refuses connections
	started := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		started <- srv.Start()
	}()
	begin := time.Now()
	store, err := openStore(t.Context(), &config{RedisURL: srv.URL(), LeaseTTL: time.Second}, slog.New(slog.DiscardHandler), nil)
	if serr := <-started; serr != nil {
		t.Fatalf("cannot restart redis-server: %v", serr)
	}
	if err != nil {
		t.Fatalf("unexpected openStore error %.1fs after a start Redis refused, Redis up after 0.5s; got %v; want the store", time.Since(begin).Seconds(), err)
	}
	store.(io.Closer).Close()
	if d := time.Since(begin); d > storeOpenTimeout {
		t.Fatalf("unexpected openStore duration %v; want at most %v", d, storeOpenTimeout)
	}
}

// A Redis that refuses the connection — a wrong password here — is a
// configuration error: one line naming REDIS_URL, exit 2, at once. It was
// waited for 10 s as an unreachable Redis ("cannot reach the directory;
// retrying"), then exit 1, which deploy/systemd restarts for ever where
// its start limit ends a configuration error's restarts (R-SRV-2, R-SRV-3).
func TestRedisRefusingCredentialsExits2_RSRV3(t *testing.T) {
	srv := redistest.StartServer(t)
	if _, err := srv.Do("CONFIG", "SET", "requirepass", "right-pass"); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"PINBOARD_PASSPORT": `{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"TOK"},"scopes":["pinboard:worker"]}]}]}`,
		"TOK":               "t",
		"REDIS_URL":         "redis://:wrong-s3cret@" + strings.TrimPrefix(srv.URL(), "redis://"),
		"HOST":              "127.0.0.1",
		"PORT":              "0",
	}
	var stderr bytes.Buffer
	began := time.Now()
	code := run(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &stderr)
	took, out := time.Since(began), stderr.String()
	if code != 2 || !strings.HasPrefix(out, "pinboard: REDIS_URL: ") || !strings.Contains(out, "WRONGPASS") || strings.Count(out, "\n") != 1 {
		t.Fatalf("unexpected start against a Redis refusing the password; got exit %d, %q; want exit 2, one line naming REDIS_URL and WRONGPASS", code, out)
	}
	if strings.Contains(out, "wrong-s3cret") {
		t.Fatalf("unexpected password in %q", out)
	}
	if took >= storeOpenTimeout/2 {
		t.Fatalf("unexpected wait before exiting; got %v; want at once, not the wait for an unreachable Redis (%v)", took, storeOpenTimeout)
	}
}

// A SIGTERM while the start still waits for a Redis that refuses
// connections stops it there: exit 0 with a log line, soon, not after the
// rest of storeOpenTimeout. Signals were watched only from the store's
// opening on, and such a signal killed pinboard by its default action
// (exit by signal) (R-SRV-2, R-SRV-3).
func TestSignalWhileWaitingForRedisStopsCleanly_RSRV2_RSRV3(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Stop() // its port now refuses connections
	env := map[string]string{
		"PINBOARD_PASSPORT": `{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"TOK"},"scopes":["pinboard:worker"]}]}]}`,
		"TOK":               "t",
		"REDIS_URL":         srv.URL(),
		"HOST":              "127.0.0.1",
		"PORT":              "0",
	}
	stderr := &testlog.Buffer{}
	done := make(chan int, 1)
	began := time.Now()
	go func() { done <- run(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, stderr) }()
	// The retry warning comes after signal.Notify: the signal below is
	// caught, and cannot kill the test binary.
	deadline := time.Now().Add(storeOpenTimeout / 2)
	for !strings.Contains(stderr.String(), "retrying") {
		if time.Now().After(deadline) {
			t.Fatalf("no retry warning within %v: %q", storeOpenTimeout/2, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		out := stderr.String()
		if code != 0 || !strings.Contains(out, "stopped before the directory opened") {
			t.Fatalf("unexpected stop while waiting for Redis; got exit %d, %q; want exit 0 and the stop logged", code, out)
		}
		if strings.Contains(out, "cannot open the directory") {
			t.Fatalf("unexpected failure logged for a stop: %q", out)
		}
	case <-time.After(storeOpenTimeout + 5*time.Second):
		t.Fatalf("run still waiting %v after SIGTERM", time.Since(began))
	}
	if d := time.Since(began); d >= storeOpenTimeout {
		t.Fatalf("unexpected wait before stopping; got %v; want the SIGTERM to end the wait for Redis (%v)", d, storeOpenTimeout)
	}
}
