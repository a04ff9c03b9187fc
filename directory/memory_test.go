package directory_test

import (
	"context"
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
	if _, _, err := m.WindDown(ctx, "/c", "x", nil, now); err != nil {
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
