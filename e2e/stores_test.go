package e2e

import (
	"testing"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// forEachStore runs fn once on the memory: store and once on a fresh Redis
// (a redis-server this test starts), in parallel subtests: the fleet
// lifecycle must behave the same on both stores (issue 4). env carries
// REDIS_URL for the pinboard process; nil means memory:.
func forEachStore(t *testing.T, fn func(t *testing.T, env []string)) {
	t.Helper()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		fn(t, nil)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		requireSuite(t)
		srv := redistest.StartServer(t)
		fn(t, []string{"REDIS_URL=" + srv.URL()})
	})
}
