package directory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// BenchmarkMemoryReregister100k: a worker re-registers listing the 100,000
// instances a register may carry at most, all its own. Every other store
// call but Lookup takes the memory store's lock, so what matters is the
// longest single hold: reported as max-hold-ms, the longest stretch
// between the start, the batch boundaries (where the lock is free) and
// the end, and as max-wait-ms, the longest another goroutine waited for
// the lock (through Quarantine, which takes it and does nothing else).
func BenchmarkMemoryReregister100k(b *testing.B) {
	m := directory.NewMemory(time.Hour, time.Now())
	reg, now := ownInstances(b, m, 100_000)
	memoryHoldRounds(b, m, directory.SetAfterRegisterBatch, func() time.Time { return now }, func() error {
		res, err := m.Register(context.Background(), reg, now)
		if err != nil || len(res.Duplicates) != 0 {
			return fmt.Errorf("cannot re-register: %v, %d duplicates", err, len(res.Duplicates))
		}
		reg.PrevSessionID = res.SessionID
		return nil
	}, nil)
}

// BenchmarkMemoryDrop100k: a worker holding 100,000 ids deregisters.
// Reported as BenchmarkMemoryReregister100k does: max-hold-ms, the
// longest stretch between the start, the batch boundaries and the end,
// and max-wait-ms, the longest another goroutine waited for the lock.
func BenchmarkMemoryDrop100k(b *testing.B) {
	m := directory.NewMemory(time.Hour, time.Now())
	var reg *directory.Registration
	var now time.Time
	memoryHoldRounds(b, m, directory.SetAfterDropBatch, func() time.Time {
		reg, now = ownInstances(b, m, 100_000)
		return now
	}, func() error {
		return m.Deregister(context.Background(), reg.PrevSessionID, now)
	}, nil)
}

// BenchmarkMemoryDrainRelease100k: an operator's timed drain of a worker
// holding 100,000 ids reaches its deadline, and the sweep force-releases
// them (R-LS-5). Reported as BenchmarkMemoryDrop100k.
func BenchmarkMemoryDrainRelease100k(b *testing.B) {
	m := directory.NewMemory(time.Hour, time.Now())
	var deadline time.Time
	memoryHoldRounds(b, m, directory.SetAfterDropBatch, func() time.Time {
		deadline = drainedOwner(b, m)
		return deadline
	}, func() error {
		return m.Sweep(context.Background(), deadline)
	}, func() { unplacedAfterRelease(b, m, deadline) })
}

// memoryHoldRounds runs b.N rounds of prepare (untimed; it returns the
// store's time for the round), op (timed) and check (untimed, when not
// nil), and reports what a long hold of the memory store's lock costs
// everybody else: max-hold-ms, the longest stretch between the start of
// an op, the batch boundaries hook reports (where the lock is free) and
// its end, and max-wait-ms, the longest another goroutine waited for the
// lock (through Quarantine, which takes it and does nothing else).
func memoryHoldRounds(b *testing.B, m *directory.Memory, hook func(directory.Store, func()),
	prepare func() time.Time, op func() error, check func()) {
	var hold, wait time.Duration
	var mark time.Time
	hook(m, func() {
		hold = max(hold, time.Since(mark))
		mark = time.Now()
	})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		now := prepare()
		b.StartTimer()
		waited := lockWaitWhile(m, now)
		mark = time.Now()
		err := op()
		hold = max(hold, time.Since(mark))
		wait = max(wait, waited())
		if err != nil {
			b.Fatal(err)
		}
		if check != nil {
			b.StopTimer()
			check()
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(hold.Microseconds())/1000, "max-hold-ms")
	b.ReportMetric(float64(wait.Microseconds())/1000, "max-wait-ms")
}

// drainedOwner gives a worker 100,000 ids and an operator's timed drain,
// and returns the drain's deadline.
func drainedOwner(b *testing.B, s directory.Store) time.Time {
	ctx := context.Background()
	reg, now := ownInstances(b, s, 100_000)
	deadline := now.Add(time.Minute)
	if found, err := s.SetDrain(ctx, reg.ClientID, directory.DrainState{Draining: true, Deadline: deadline}, now); !found || err != nil {
		b.Fatalf("cannot drain; got %v, %v", found, err)
	}
	return deadline
}

// unplacedAfterRelease checks that the forced release freed the drained
// worker's first and last ids.
func unplacedAfterRelease(b *testing.B, s directory.Store, deadline time.Time) {
	for _, id := range []string{"instance-0", "instance-99999"} {
		if p, err := s.Placement(context.Background(), "/c", id, deadline); !errors.Is(err, directory.ErrNoPlacement) {
			b.Fatalf("unexpected placement of %s after the forced release; got %+v, %v", id, p, err)
		}
	}
}

// lockWaitWhile takes the memory store's lock back to back until the
// returned function is called, which reports the longest wait.
func lockWaitWhile(m *directory.Memory, now time.Time) func() time.Duration {
	return longestWhile(func() { _, _ = m.Quarantine(context.Background(), now) })
}

// BenchmarkMemoryHeartbeatManyAcks: a heartbeat listing 50,000 acks (a
// 1 MiB body holds about that many) against 1,000 queued wind-downs, all
// under the memory store's lock. Checking each message against the list
// took about 400 ms per heartbeat, holding every other call; the acks
// are a set now (R-CM-1).
func BenchmarkMemoryHeartbeatManyAcks(b *testing.B) {
	ctx := context.Background()
	now := time.Now()
	m := directory.NewMemory(time.Hour, now)
	if _, err := m.Place(ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now}); err != nil {
		var q *directory.QuarantineError
		if !errors.As(err, &q) {
			b.Fatal(err)
		}
		now = now.Add(q.Remaining)
	}
	res, err := m.Register(ctx, &directory.Registration{ClientID: "a", Sub: "s", Secret: "k", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:1/a", Headroom: 1}, now)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		if _, err := m.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: fmt.Sprint("i", i), Now: now}); err != nil {
			b.Fatal(err)
		}
		if _, _, err := m.WindDown(ctx, "/c", fmt.Sprint("i", i), "", &now, now); err != nil {
			b.Fatal(err)
		}
	}
	acks := make([]string, 50_000)
	for i := range acks {
		acks[i] = fmt.Sprintf("%016x", i) // none queued: every message is checked against all
	}
	beat := &directory.Beat{SessionID: res.SessionID, Sub: "s", Headroom: 1, Acks: acks}
	b.ResetTimer()
	for b.Loop() {
		if r, err := m.Heartbeat(ctx, beat, now); err != nil || len(r.Messages) != 1000 {
			b.Fatalf("unexpected heartbeat; got %v messages, %v", len(r.Messages), err)
		}
	}
}
