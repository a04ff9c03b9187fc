package registry

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// forEachStore runs fn on a fresh harness over each store kind: the
// memory store and a Redis directory on a redis-server of this test's
// own (127.0.0.1), so what the registry answers cannot drift between
// them (R-REG-2 "byte for byte" on both stores). The Redis harness's
// h.store is nil: tests run through it use h.ds.
func forEachStore(t *testing.T, fn func(t *testing.T, h *harness)) {
	t.Helper()
	t.Run("memory", func(t *testing.T) { fn(t, newHarness(t)) })
	srv := redistest.StartServer(t)
	var n atomic.Int64
	t.Run("redis", func(t *testing.T) {
		fn(t, newRedisHarness(t, srv.URL(), fmt.Sprintf("reg%d", n.Add(1))))
	})
}

// newRedisHarness is newHarness on a Redis directory at url under prefix.
func newRedisHarness(t testing.TB, url, prefix string) *harness {
	t.Helper()
	h := &harness{t: t, now: time.Unix(1_800_000_000, 0), fw: newFakeWorker(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := directory.OpenRedis(ctx, url, directory.RedisOptions{LeaseTTL: testTTL, Prefix: prefix})
	if err != nil {
		t.Fatalf("cannot open the redis directory: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	h.ds = s
	h.r = h.registry(testPassport(t))
	return h
}
