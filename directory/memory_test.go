package directory_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/directory/directorytest"
)

func TestMemoryContract(t *testing.T) {
	directorytest.Run(t, func(t *testing.T, ttl time.Duration, now time.Time) directory.Store {
		return directory.NewMemory(ttl, now)
	})
}

// TestMemoryBetweenBatches: what may happen between two batches of a
// registration's instances, while the lock is free.
func TestMemoryBetweenBatches(t *testing.T) {
	directorytest.RunBetweenBatches(t, func(t *testing.T, ttl time.Duration, now time.Time) directory.Store {
		return directory.NewMemory(ttl, now)
	}, directory.SetAfterRegisterBatch)
}

// TestMemoryBetweenDropBatches: what may happen between two batches of
// the rows a dropped session frees, while the lock is free.
func TestMemoryBetweenDropBatches(t *testing.T) {
	directorytest.RunBetweenDropBatches(t, func(t *testing.T, ttl time.Duration, now time.Time) directory.Store {
		return directory.NewMemory(ttl, now)
	}, directory.SetAfterDropBatch)
}

// TestMemoryQueueExpiry_RCM1: a control queue goes two leases after its
// last write or read, even when nothing else reads it.
func TestMemoryQueueExpiry_RCM1(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	ttl := time.Second
	m := directory.NewMemory(ttl, now)
	res, err := m.Register(ctx, &directory.Registration{ClientID: "a", Sub: "s", Secret: "k", Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:1", Instances: map[string][]string{"/c": {"x"}}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.WindDown(ctx, "/c", "x", "", nil, now); err != nil {
		t.Fatal(err)
	}
	if n := directory.MemoryQueues(m); n != 1 {
		t.Fatalf("unexpected queues; got %d; want 1", n)
	}
	now = now.Add(900 * time.Millisecond)
	if _, err := m.Heartbeat(ctx, &directory.Beat{SessionID: res.SessionID, Sub: "s"}, now); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * ttl)
	_ = m.Sweep(ctx, now)
	if n := directory.MemoryQueues(m); n != 1 {
		t.Fatalf("unexpected queue expiry at exactly two leases after the read; got %d queues", n)
	}
	now = now.Add(time.Millisecond)
	_ = m.Sweep(ctx, now)
	if n := directory.MemoryQueues(m); n != 0 {
		t.Fatalf("unexpected queues two leases after the last read; got %d; want 0", n)
	}
}

// TestMemorySweepFreesBindings_RLS4: a sweep frees the hostname bindings
// no live session holds, and only those: a store that kept them grew by
// a binding per hostname and namespace for every deployment it ever saw.
func TestMemorySweepFreesBindings_RLS4(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	ttl := time.Second
	m := directory.NewMemory(ttl, now)
	register := func(client, host string, epoch int64) string {
		t.Helper()
		res, err := m.Register(ctx, &directory.Registration{ClientID: client, Sub: "s", Secret: "k", Namespaces: []string{"/c", "/d"},
			AdvertiseURL: "http://127.0.0.1:1/" + client, Hostname: host, Env: "blue", Epoch: epoch}, now)
		if err != nil {
			t.Fatal(err)
		}
		return res.SessionID
	}
	for i := range 10 {
		register(string(rune('a'+i)), string(rune('a'+i))+".example", 1)
	}
	keep := register("keep", "keep.example", 3)
	if n := directory.MemoryBindings(m); n != 22 {
		t.Fatalf("unexpected bindings; got %d; want 22", n)
	}
	now = now.Add(ttl / 2)
	if _, err := m.Heartbeat(ctx, &directory.Beat{SessionID: keep, Sub: "s"}, now); err != nil {
		t.Fatal(err)
	}
	now = now.Add(ttl/2 + time.Millisecond)
	_ = m.Sweep(ctx, now)
	if n := directory.MemoryBindings(m); n != 2 {
		t.Fatalf("unexpected bindings after the sweep; got %d; want keep.example's 2", n)
	}
}

// BenchmarkMemorySweepBindings: one sweep of 2,000 live hostname-bound
// sessions, 5 namespaces each (10,000 bindings), under the store's lock.
func BenchmarkMemorySweepBindings(b *testing.B) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	m := directory.NewMemory(time.Hour, now)
	ns := []string{"/a", "/b", "/c", "/d", "/e"}
	for i := range 2000 {
		id := strconv.Itoa(i)
		if _, err := m.Register(ctx, &directory.Registration{ClientID: "w" + id, Sub: "s", Secret: "k", Namespaces: ns,
			AdvertiseURL: "http://127.0.0.1:1/" + id, Hostname: "h" + id + ".example", Env: "blue", Epoch: 1}, now); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = m.Sweep(ctx, now)
	}
	if n := directory.MemoryBindings(m); n != 10000 {
		b.Fatalf("unexpected bindings; got %d; want 10000", n)
	}
}
