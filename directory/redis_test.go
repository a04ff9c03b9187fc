package directory_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/directory/directorytest"
	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// redisFactory opens a fresh directory per test on one server: each store
// gets its own key prefix (hash tag), so stores never see each other's
// keys and, on a cluster, land on different slots.
func redisFactory(url string) directorytest.Factory {
	return redisFactoryTLS(url, nil)
}

// redisFactoryTLS is redisFactory with the client's TLS settings.
func redisFactoryTLS(url string, tc *tls.Config) directorytest.Factory {
	var n atomic.Int64
	return func(t *testing.T, ttl time.Duration, now time.Time) directory.Store {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := directory.OpenRedis(ctx, url, directory.RedisOptions{
			LeaseTTL:  ttl,
			TLSConfig: tc,
			Prefix:    fmt.Sprintf("contract%d-%d", time.Now().UnixNano()%1e6, n.Add(1)),
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

// TestRedisBetweenBatches: what may happen between two script calls of a
// registration's instances, on a single server and on a cluster.
func TestRedisBetweenBatches(t *testing.T) {
	srv := redistest.StartServer(t)
	directorytest.RunBetweenBatches(t, redisFactory(srv.URL()), directory.SetAfterRegisterBatch)
	if testing.Short() {
		return
	}
	c := redistest.StartCluster(t, 3)
	t.Run("Cluster", func(t *testing.T) {
		directorytest.RunBetweenBatches(t, redisFactory(c.URL()), directory.SetAfterRegisterBatch)
	})
}

// TestRedisBetweenDropBatches: what may happen between two script calls
// freeing a dropped session's rows, on a single server and on a cluster.
func TestRedisBetweenDropBatches(t *testing.T) {
	srv := redistest.StartServer(t)
	directorytest.RunBetweenDropBatches(t, redisFactory(srv.URL()), directory.SetAfterDropBatch)
	if testing.Short() {
		return
	}
	c := redistest.StartCluster(t, 3)
	t.Run("Cluster", func(t *testing.T) {
		directorytest.RunBetweenDropBatches(t, redisFactory(c.URL()), directory.SetAfterDropBatch)
	})
}

func TestRedisClusterContract(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster")
	}
	c := redistest.StartCluster(t, 3)
	directorytest.Run(t, redisFactory(c.URL()))
}

// TestRedisTLSContract: rediss:// is the same store over TLS; the
// client-side cache's invalidation pushes arrive over it too (R-SRV-3).
func TestRedisTLSContract_RSRV3(t *testing.T) {
	srv := redistest.StartTLSServer(t)
	tc, err := srv.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	directorytest.Run(t, redisFactoryTLS(srv.TLSURL(), tc))
}

// TestRedisTLSRejectsUnknownCA: without the CA, the TLS handshake fails
// at open with an error naming the certificate, not a hang.
func TestRedisTLSRejectsUnknownCA_RSRV3(t *testing.T) {
	srv := redistest.StartTLSServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := directory.OpenRedis(ctx, srv.TLSURL(), directory.RedisOptions{LeaseTTL: time.Second})
	if err == nil {
		_ = s.Close()
		t.Fatal("unexpected open over TLS with a server certificate from an unknown CA")
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("unexpected error; got %v; want one about the certificate", err)
	}
}

// TestRedisSentinelContract: redis+sentinel:// finds the master through
// a real sentinel and runs the same contract (R-SRV-3).
func TestRedisSentinelContract_RSRV3(t *testing.T) {
	master := redistest.StartServer(t)
	sent := redistest.StartSentinel(t, master, "pinboard-master")
	directorytest.Run(t, redisFactory(sent.URL()))
}

// TestRedisSentinelFailover: when Sentinel promotes the replica of a
// dead master, the store follows it: placements written before the
// failover (replicated) resolve to the same owner, and new ones land on
// the new master. Errors in between are ErrUnavailable-class, never a
// second owner.
func TestRedisSentinelFailover_RSRV3(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a sentinel failover")
	}
	master := redistest.StartServer(t)
	replica := redistest.StartReplica(t, master)
	sent := redistest.StartSentinel(t, master, "pinboard-master")
	waitFor(t, 15*time.Second, "the sentinel to know the replica", func() bool {
		out, err := sent.Do("SENTINEL", "replicas", "pinboard-master")
		return err == nil && strings.Contains(out, strconv.Itoa(replica.Port))
	})
	ctx := ctxT(t)
	s := openNode(t, sent.URL(), "failover", 30*time.Second)
	now := warmRedis(t, s, time.Now())
	wa := register(t, s, "a", 1000, now)
	r1, err := s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "alice", Now: now})
	if err != nil || r1.Owner.SessionID != wa {
		t.Fatalf("unexpected placement; got %+v, %v", r1, err)
	}
	// Replicated means the replica applied it: WAIT through redis-cli
	// counts the writes of its own connection (none) and answered 1 at
	// once, while a replica just synced (diskless) gets the writes made
	// since only once the master reads its next REPLCONF ACK, up to a
	// second later. Killed in between, the master took them along and the
	// promoted replica met the store empty: a cold start (seen under load).
	if err := redistest.WaitReplicated(master, replica, 10*time.Second); err != nil {
		t.Fatalf("unexpected replication before the failover; got %v; want the replica at the master's offset", err)
	}

	// What the sentinel did, for a failure from here on.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sentinel log:\n%s", sent.Output())
		}
	})
	master.Stop()
	// Polled every 20 ms: each look is a redis-cli process, and polled
	// flat out they took the CPU the sentinel and the replica need.
	waitFor(t, 20*time.Second, "the sentinel to promote the replica", func() bool {
		addr, err := sent.MasterAddr()
		if err == nil && addr == replica.Addr {
			return true
		}
		time.Sleep(20 * time.Millisecond)
		return false
	})
	var r2 directory.Route
	waitFor(t, 20*time.Second, "the store to reach the new master", func() bool {
		r2, err = s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "alice", Now: now})
		if err != nil && !errors.Is(err, directory.ErrUnavailable) {
			// A cold start here means the node met a directory without
			// the placement: say whether the promoted replica holds it
			// (the keys are "{failover}:…").
			keys, kerr := replica.Do("KEYS", "{failover}:*")
			role, rerr := replica.Do("ROLE")
			t.Fatalf("unexpected error during the failover; got %v (the promoted replica: keys %q, %v; role %q, %v); want ErrUnavailable until the store reaches it", err, keys, kerr, role, rerr)
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // the client reconnects meanwhile
		}
		return err == nil
	})
	if r2.Owner.SessionID != wa || r2.Placed || r2.Epoch != r1.Epoch {
		t.Fatalf("unexpected resolution after the failover; got %+v; want the placement from before (%+v)", r2, r1)
	}
	r3, err := s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "bob", Now: now})
	if err != nil || r3.Owner.SessionID != wa || !r3.Placed {
		t.Fatalf("unexpected new placement on the promoted master; got %+v, %v", r3, err)
	}
	if out, err := replica.Do("ROLE"); err != nil || !strings.HasPrefix(out, "master") {
		t.Fatalf("unexpected role of the promoted replica; got %q, %v", out, err)
	}
}

// openNode opens one more node on an existing directory (same prefix).
func openNode(t testing.TB, url, prefix string, ttl time.Duration) *directory.Redis {
	t.Helper()
	return openNodeLogged(t, url, prefix, ttl, nil)
}

// openNodeLogged is openNode logging at debug level to log (nil: no log).
func openNodeLogged(t testing.TB, url, prefix string, ttl time.Duration, log *testlog.Buffer) *directory.Redis {
	t.Helper()
	o := directory.RedisOptions{LeaseTTL: ttl, Prefix: prefix}
	if log != nil {
		o.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := directory.OpenRedis(ctx, url, o)
	if err != nil {
		t.Fatalf("cannot open the redis directory: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// warmPair passes the cold start through a and registers worker "a" on a
// with far more headroom than worker "b" on b, so that new ids go to a's
// worker: the set-up of the two-node tests. It returns the time past the
// quarantine and the two sessions.
func warmPair(t *testing.T, a, b *directory.Redis) (now time.Time, wa, wb string) {
	t.Helper()
	now = warmRedis(t, a, time.Now())
	return now, register(t, a, "a", 1e6, now), register(t, b, "b", 1, now)
}

// warmRedis runs the first placement attempt and returns the time the
// quarantine ends (R-CS-1).
func warmRedis(t *testing.T, s directory.Store, now time.Time) time.Time {
	t.Helper()
	_, err := s.Place(context.Background(), &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now})
	var q *directory.QuarantineError
	if !errors.As(err, &q) {
		t.Fatalf("unexpected first placement; got %v; want a quarantine", err)
	}
	// The rest is measured from now rounded up to the microsecond, as the
	// claim script compared it: round the sum up too, so the tests run from
	// the quarantine's end exactly, on the microsecond grid the store keeps
	// leases on (a time between grid points made leases compare unequal).
	end := now.Add(q.Remaining)
	if t := end.Truncate(time.Microsecond); !t.Equal(end) {
		end = t.Add(time.Microsecond)
	}
	return end
}

func register(t *testing.T, s directory.Store, client string, headroom float64, now time.Time, instances ...string) string {
	t.Helper()
	reg := &directory.Registration{ClientID: client, Sub: "sub", Secret: "k-" + client,
		Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:9/" + client, Headroom: headroom}
	if len(instances) > 0 {
		reg.Instances = map[string][]string{"/c": instances}
	}
	res, err := s.Register(context.Background(), reg, now)
	if err != nil {
		t.Fatalf("cannot register %s: %v", client, err)
	}
	return res.SessionID
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("unexpected wait; %s not true after %v", what, d)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return time.Since(start)
}
