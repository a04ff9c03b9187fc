package directory

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A Redis refusing writes for a while (maxmemory reached under
// noeviction: OOM; min-replicas-to-write unmet: NOREPLICAS) refuses the
// era's SET NX, a no-op while the era exists: the era check still reads
// the era and the connection serving it. On a cluster the check is one
// MULTI block, which Redis refuses whole when a queued command is refused
// — under OOM it refuses every one, reads too — and onSlot sends it again
// as a plain pipeline: the periodic connection check (revalidate) takes
// that path too, and sending the same rueidis commands twice panicked, in
// the revalidator's goroutine, ending the process, until they were
// pinned. The cluster path is taken here on a single server (the block
// and its refusal are the same); the block on a real cluster is
// TestRedisClusterConnectionCheckFollowsFailover_RPL1's. Without an era
// none can be started then, and the error names the refusal (R-CS-1).
// A refusal that lasts (NOPERM) still fails the open:
// TestOpenRedisRefused_RSRV3.
func TestRedisEraCheckWhileWritesRefused_RCS1(t *testing.T) {
	srv := redistest.StartServer(t)
	for _, tc := range []struct {
		name    string
		cluster bool
	}{{"single", false}, {"cluster", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r, err := OpenRedis(ctx, srv.URL(), RedisOptions{LeaseTTL: 10 * time.Second, Prefix: "era-" + tc.name})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				r.Close()
				if _, err := srv.Do("CONFIG", "SET", "maxmemory", "0"); err != nil {
					t.Error(err)
				}
			})
			r.cluster.Store(tc.cluster)
			r.eraMu.Lock()
			wantEra, wantConn := r.era, r.connID
			r.eraMu.Unlock()
			if _, err := srv.Do("CONFIG", "SET", "maxmemory", "1"); err != nil {
				t.Fatal(err)
			}
			if out, _ := srv.Do("SET", "probe", "x"); !strings.HasPrefix(out, "OOM") {
				t.Fatalf("unexpected answer to a write with maxmemory 1; got %q; want OOM", out)
			}
			era, conn, err := r.ensureEra(ctx)
			if err != nil || era != wantEra || conn != wantConn {
				t.Errorf("unexpected era check while writes are refused; got %q %q %v; want %q %q", era, conn, err, wantEra, wantConn)
			}
			if err := r.revalidate(ctx); err != nil {
				t.Errorf("unexpected connection check while writes are refused; got %v; want none", err)
			}
			if _, err := srv.Do("DEL", r.prefix+"era"); err != nil {
				t.Fatal(err)
			}
			if _, _, err := r.ensureEra(ctx); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
				t.Errorf("unexpected era check without an era while writes are refused; got %v; want unavailable, naming OOM", err)
			}
		})
	}
}
