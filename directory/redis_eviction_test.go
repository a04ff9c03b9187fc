package directory_test

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

// A Redis that may evict keys under memory pressure (maxmemory-policy
// allkeys-*, the usual cache setting) drops placement rows and leases
// without anyone writing them: an evicted row is placed again while its
// owner still hosts the instance — two owners (R-PL-1) — and an evicted
// lease ends a live worker (R-LS-2); volatile-* policies drop control
// queues before they are acked (R-CM-1). Nothing said so: the open now
// warns, naming the policy, and stays quiet on noeviction.
func TestRedisWarnsOfEvictingPolicy_RPL1(t *testing.T) {
	srv := redistest.StartServer(t)
	open := func() string {
		var log testlog.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := directory.OpenRedis(ctx, srv.URL(), directory.RedisOptions{LeaseTTL: 10 * time.Second, Prefix: "evict",
			Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatalf("cannot open the redis directory: %v", err)
		}
		_ = s.Close()
		return log.String()
	}
	if out := open(); strings.Contains(out, "maxmemory-policy") {
		t.Fatalf("unexpected warning with noeviction; got %q", out)
	}
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		if _, err := srv.Do("CONFIG", "SET", "maxmemory-policy", policy); err != nil {
			t.Fatal(err)
		}
		if out := open(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "maxmemory-policy") || !strings.Contains(out, policy) {
			t.Fatalf("unexpected log with maxmemory-policy %s; got %q; want a warning naming it", policy, out)
		}
	}
}
