package directory_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/directory/directorytest"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// redisFactory opens a fresh directory per test on one server: each store
// gets its own key prefix (hash tag), so stores never see each other's
// keys and, on a cluster, land on different slots.
func redisFactory(url string) directorytest.Factory {
	var n atomic.Int64
	return func(t *testing.T, ttl time.Duration, now time.Time) directory.Store {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := directory.OpenRedis(ctx, url, directory.RedisOptions{
			LeaseTTL: ttl,
			Prefix:   fmt.Sprintf("contract%d-%d", time.Now().UnixNano()%1e6, n.Add(1)),
		})
		if err != nil {
			t.Fatalf("cannot open the redis directory: %v", err)
		}
		return s
	}
}

func TestRedisContract(t *testing.T) {
	srv := redistest.StartServer(t)
	directorytest.Run(t, redisFactory(srv.URL()))
}

func TestRedisClusterContract(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster")
	}
	c := redistest.StartCluster(t, 3)
	directorytest.Run(t, redisFactory(c.URL()))
}
