package directory_test

import (
	"context"
	"errors"
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
	var hold, wait time.Duration
	var mark time.Time
	directory.SetAfterRegisterBatch(m, func() {
		hold = max(hold, time.Since(mark))
		mark = time.Now()
	})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		waited := lockWaitWhile(m, now)
		mark = time.Now()
		res, err := m.Register(context.Background(), reg, now)
		hold = max(hold, time.Since(mark))
		wait = max(wait, waited())
		if err != nil || len(res.Duplicates) != 0 {
			b.Fatalf("cannot re-register: %v, %d duplicates", err, len(res.Duplicates))
		}
		reg.PrevSessionID = res.SessionID
	}
	b.ReportMetric(float64(hold.Microseconds())/1000, "max-hold-ms")
	b.ReportMetric(float64(wait.Microseconds())/1000, "max-wait-ms")
}

// BenchmarkMemoryDrop100k: a worker holding 100,000 ids deregisters.
// Reported as BenchmarkMemoryReregister100k does: max-hold-ms, the
// longest stretch between the start, the batch boundaries and the end,
// and max-wait-ms, the longest another goroutine waited for the lock.
func BenchmarkMemoryDrop100k(b *testing.B) {
	m := directory.NewMemory(time.Hour, time.Now())
	var hold, wait time.Duration
	var mark time.Time
	directory.SetAfterDropBatch(m, func() {
		hold = max(hold, time.Since(mark))
		mark = time.Now()
	})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		reg, now := ownInstances(b, m, 100_000)
		b.StartTimer()
		waited := lockWaitWhile(m, now)
		mark = time.Now()
		err := m.Deregister(context.Background(), reg.PrevSessionID, now)
		hold = max(hold, time.Since(mark))
		wait = max(wait, waited())
		if err != nil {
			b.Fatalf("cannot deregister: %v", err)
		}
	}
	b.ReportMetric(float64(hold.Microseconds())/1000, "max-hold-ms")
	b.ReportMetric(float64(wait.Microseconds())/1000, "max-wait-ms")
}

// BenchmarkMemoryDrainRelease100k: an operator's timed drain of a worker
// holding 100,000 ids reaches its deadline, and the sweep force-releases
// them (R-LS-5). Reported as BenchmarkMemoryDrop100k.
func BenchmarkMemoryDrainRelease100k(b *testing.B) {
	m := directory.NewMemory(time.Hour, time.Now())
	ctx := context.Background()
	var hold, wait time.Duration
	var mark time.Time
	directory.SetAfterDropBatch(m, func() {
		hold = max(hold, time.Since(mark))
		mark = time.Now()
	})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		reg, now := ownInstances(b, m, 100_000)
		deadline := now.Add(time.Minute)
		if found, err := m.SetDrain(ctx, reg.ClientID, directory.DrainState{Draining: true, Deadline: deadline}, now); !found || err != nil {
			b.Fatalf("cannot drain; got %v, %v", found, err)
		}
		b.StartTimer()
		waited := lockWaitWhile(m, deadline)
		mark = time.Now()
		err := m.Sweep(ctx, deadline)
		hold = max(hold, time.Since(mark))
		wait = max(wait, waited())
		if err != nil {
			b.Fatalf("cannot sweep: %v", err)
		}
		b.StopTimer()
		for _, id := range []string{"instance-0", "instance-99999"} {
			if p, err := m.Placement(ctx, "/c", id, deadline); !errors.Is(err, directory.ErrNoPlacement) {
				b.Fatalf("unexpected placement of %s after the forced release; got %+v, %v", id, p, err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(hold.Microseconds())/1000, "max-hold-ms")
	b.ReportMetric(float64(wait.Microseconds())/1000, "max-wait-ms")
}

// lockWaitWhile takes the memory store's lock back to back until the
// returned function is called, which reports the longest wait.
func lockWaitWhile(m *directory.Memory, now time.Time) func() time.Duration {
	return longestWhile(func() { _, _ = m.Quarantine(context.Background(), now) })
}
