package directory_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Lease expiries are written with the clock of the node that took the
// registration or heartbeat, and compared with the clock of every node
// that reads them (claims, lookups, sweeps): a node whose clock is off
// takes live workers for dead (its claims move their ids, its sweep drops
// their sessions) or dead ones for live (R-LS-1, R-LS-2, R-PL-1). Nothing
// told the operator: the open and the periodic connection check now read
// Redis's clock in the same round trip and warn, once per episode, when the
// node's differs from it by more than half the staleness budget.
func TestRedisWarnsOfClockSkew_RLS2(t *testing.T) {
	srv := redistest.StartServer(t)
	var offset atomic.Int64
	var log testlog.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func(prefix string, now func() time.Time) *directory.Redis {
		s, err := directory.OpenRedis(ctx, srv.URL(), directory.RedisOptions{LeaseTTL: 10 * time.Second, Prefix: prefix,
			Now: now, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatalf("cannot open the redis directory: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	open("clock", nil)
	if out := log.String(); strings.Contains(out, "clock") {
		t.Fatalf("unexpected clock warning for a node on Redis's clock; got %q", out)
	}
	offset.Store(int64(10 * time.Second))
	s := open("clock", func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	out := log.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "clock") || !strings.Contains(out, "skew=") {
		t.Fatalf("unexpected log for a node 10 s ahead of Redis; got %q; want a warning naming the skew", out)
	}
	if got := s.Stats().ClockSkew; got < 9*time.Second || got > 11*time.Second {
		t.Fatalf("unexpected clock skew in the stats; got %v; want about 10s", got)
	}
	if err := s.Revalidate(ctx); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(log.String(), "level=WARN"); n != 1 {
		t.Fatalf("unexpected warnings after a second check of the same skew; got %d; want 1 (once per episode):\n%s", n, log.String())
	}
	offset.Store(0)
	if err := s.Revalidate(ctx); err != nil {
		t.Fatal(err)
	}
	if out := log.String(); !strings.Contains(out, "level=INFO") || !strings.Contains(out, "clock") {
		t.Fatalf("unexpected log once the clock agrees again; got %q; want it said", out)
	}
}
