package directory

import (
	"context"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// After a controlled failover (CLUSTER FAILOVER) a node whose slot map is
// still the old one — it sent nothing to the directory's slot since, as a
// node serving only cached ids does, until rueidis's periodic refresh —
// had its connection check's keyed GET redirected (MOVED) on its own while
// the keyless CLIENT INFO was answered by the old master, now a replica:
// the check took the old connection for the one serving the directory and
// kept every cached row. Those rows are tracked only in the old master's
// table, which a full resync of the replica frees (emptying its data as
// FLUSHALL does, whose nil invalidation is what wakes the check on a
// cluster), so their changes were never pushed until the next check 10 s
// later. The check is run directly here: a partial resync, the usual
// kind, frees nothing. The check must name the connection
// serving the slot now, and drop the rows (R-PL-1).
func TestRedisClusterConnectionCheckFollowsFailover_RPL1(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster with replicas")
	}
	c := redistest.StartClusterReplicas(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := OpenRedis(ctx, c.URL(), RedisOptions{LeaseTTL: 10 * time.Second, Prefix: "cc"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.eraMu.Lock()
	before := r.connID
	r.eraMu.Unlock()

	master, replica, err := c.MasterAndReplica("{cc}:era")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := replica.Do("CLUSTER", "FAILOVER"); err != nil || out != "OK" {
		t.Fatalf("unexpected reply to CLUSTER FAILOVER; got %q, %v", out, err)
	}
	if err := master.WaitRole("slave", 10*time.Second); err != nil {
		t.Fatalf("old master not demoted: %v", err)
	}
	reconnects := r.stats.reconnects.Load()
	if err := r.revalidate(ctx); err != nil {
		t.Fatal(err)
	}
	r.eraMu.Lock()
	after := r.connID
	r.eraMu.Unlock()
	if after == before || r.stats.reconnects.Load() != reconnects+1 {
		t.Fatalf("unexpected connection check after the failover; got connection %q (before %q), %d reconnects more; want another connection, one reconnect (rows dropped)",
			after, before, r.stats.reconnects.Load()-reconnects)
	}
}
