package directory_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// The memory store at production scale: scaleSessions workers serving one
// namespace, scaleRows ids each placed (1,000,000 rows in all), built
// once per test binary (about a second and ~300 MB).
const (
	scaleSessions = 10_000
	scaleRows     = 100
)

type scaleStore struct {
	m    *directory.Memory
	now  time.Time
	regs []*directory.Registration
	// rowBytes and sessionBytes are the heap the store grew by per row
	// and per session (runtime.ReadMemStats after a GC).
	rowBytes, sessionBytes float64
}

var (
	scaleOnce sync.Once
	scale     *scaleStore
)

// scaleFixture returns the shared store; benchmarks that change it put
// back what they take.
func scaleFixture(tb testing.TB) *scaleStore {
	scaleOnce.Do(func() { scale = buildScale(tb) })
	if scale == nil {
		tb.Fatal("cannot build the scale store")
	}
	return scale
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func buildScale(tb testing.TB) *scaleStore {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	m := directory.NewMemory(time.Hour, now)
	if _, err := m.Place(ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now}); err != nil {
		var q *directory.QuarantineError
		if !errors.As(err, &q) {
			tb.Fatal(err)
		}
		now = now.Add(q.Remaining)
	}
	st := &scaleStore{m: m, now: now}
	base := heapInUse()
	// Sessions first, without rows, to measure a session alone.
	for i := range scaleSessions {
		w := strconv.Itoa(i)
		reg := &directory.Registration{ClientID: "w" + w, Sub: "s", Secret: "k", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:1/" + w, Headroom: 1e9}
		res, err := m.Register(ctx, reg, now)
		if err != nil {
			tb.Fatal(err)
		}
		reg.PrevSessionID = res.SessionID
		st.regs = append(st.regs, reg)
	}
	withSessions := heapInUse()
	st.sessionBytes = float64(withSessions-base) / scaleSessions
	for i, reg := range st.regs {
		ids := make([]string, scaleRows)
		for k := range ids {
			ids[k] = "i" + strconv.Itoa(i) + "-" + strconv.Itoa(k)
		}
		reg.Instances = map[string][]string{"/c": ids}
		res, err := m.Register(ctx, reg, now)
		if err != nil || len(res.Duplicates) != 0 {
			tb.Fatalf("cannot register %d instances: %v", scaleRows, err)
		}
		reg.PrevSessionID = res.SessionID
	}
	st.rowBytes = float64(heapInUse()-withSessions) / (scaleSessions * scaleRows)
	return st
}

// BenchmarkMemoryScaleFootprint reports the heap per placed row and per
// session of the scale store (the ids' own strings included).
func BenchmarkMemoryScaleFootprint(b *testing.B) {
	st := scaleFixture(b)
	for b.Loop() {
	}
	b.ReportMetric(st.rowBytes, "B/row")
	b.ReportMetric(st.sessionBytes, "B/session")
}

// BenchmarkMemoryScaleSweep: the periodic sweep of the scale store with
// nothing to expire; the lock is held for all of it.
func BenchmarkMemoryScaleSweep(b *testing.B) {
	st := scaleFixture(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_ = st.m.Sweep(ctx, st.now)
	}
}

// BenchmarkMemoryScaleHeartbeat: one worker's heartbeat among 10,000.
func BenchmarkMemoryScaleHeartbeat(b *testing.B) {
	st := scaleFixture(b)
	ctx := context.Background()
	beats := make([]directory.Beat, len(st.regs))
	for i, reg := range st.regs {
		beats[i] = directory.Beat{SessionID: reg.PrevSessionID, Sub: "s", Headroom: 1e9}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := st.m.Heartbeat(ctx, &beats[i%len(beats)], st.now); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkMemoryScalePlace: a cold placement choosing among the 10,000
// sessions serving the namespace, under the store's lock; the rows placed
// are released after.
func BenchmarkMemoryScalePlace(b *testing.B) {
	st := scaleFixture(b)
	ctx := context.Background()
	var placed []directory.ReleaseRequest
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := "cold-" + strconv.Itoa(i)
		i++
		rt, err := st.m.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: st.now})
		if err != nil {
			b.Fatal(err)
		}
		placed = append(placed, directory.ReleaseRequest{NS: "/c", ID: id, SessionID: rt.Owner.SessionID})
	}
	b.StopTimer()
	_, _ = st.m.ReleaseBatch(ctx, placed, st.now)
}

// BenchmarkMemoryScaleDrop: one of the scale store's sessions, given
// 100,000 more ids, deregisters: max-hold-ms as BenchmarkMemoryDrop100k,
// and max-lookup-us, the slowest Lookup of another session's hot id meanwhile.
func BenchmarkMemoryScaleDrop(b *testing.B) {
	st := scaleFixture(b)
	ctx := context.Background()
	var reg *directory.Registration
	var lookup time.Duration
	memoryHoldRounds(b, st.m, directory.SetAfterDropBatch, func() time.Time {
		ids := make([]string, 100_000)
		for k := range ids {
			ids[k] = "big-" + strconv.Itoa(k)
		}
		reg = &directory.Registration{ClientID: "big", Sub: "s", Secret: "k", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:1/big", Headroom: 1e9, Instances: map[string][]string{"/c": ids}}
		res, err := st.m.Register(ctx, reg, st.now)
		if err != nil || len(res.Duplicates) != 0 {
			b.Fatalf("cannot register: %v", err)
		}
		reg.PrevSessionID = res.SessionID
		return st.now
	}, func() error {
		done := slowestLookupWhile(st.m, st.now, "i0-0", "i5000-50", "i9999-99")
		err := st.m.Deregister(ctx, reg.PrevSessionID, st.now)
		lookup = max(lookup, done())
		return err
	}, nil)
	directory.SetAfterDropBatch(st.m, nil)
	b.ReportMetric(float64(lookup.Microseconds()), "max-lookup-us")
}

// slowestLookupWhile looks up hot ids of the scale store, one every
// 100 µs (spinning, it would take a CPU from the call measured), until the
// returned function is called, which reports the slowest.
func slowestLookupWhile(m *directory.Memory, now time.Time, hot ...string) func() time.Duration {
	ns := []byte("/c")
	var ids [][]byte
	for _, id := range hot {
		ids = append(ids, []byte(id))
	}
	i := 0
	stop, done := make(chan struct{}), make(chan time.Duration)
	go func() {
		var worst time.Duration
		for {
			select {
			case <-stop:
				done <- worst
				return
			case <-time.After(100 * time.Microsecond):
			}
			start := time.Now()
			if _, ok := m.Lookup(ns, ids[i%len(ids)], now); !ok {
				panic("BUG: hot id not found")
			}
			worst = max(worst, time.Since(start))
			i++
		}
	}()
	return func() time.Duration {
		close(stop)
		return <-done
	}
}

// windDownScale winds 100,000 of the scale store's ids down with a
// deadline a minute on (R-CM-1), and returns the deadline.
func windDownScale(b *testing.B, st *scaleStore) time.Time {
	ctx := context.Background()
	deadline := st.now.Add(time.Minute)
	for i := range 100_000 / scaleRows {
		for k := range scaleRows {
			id := "i" + strconv.Itoa(i) + "-" + strconv.Itoa(k)
			if _, _, err := st.m.WindDown(ctx, "/c", id, "", &deadline, st.now); err != nil {
				b.Fatal(err)
			}
		}
	}
	return deadline
}

// BenchmarkMemoryScaleSweepWindDowns: the periodic sweep of the scale
// store while 100,000 timed wind-downs wait for their deadline; the
// wind-downs are revoked after.
func BenchmarkMemoryScaleSweepWindDowns(b *testing.B) {
	st := scaleFixture(b)
	ctx := context.Background()
	windDownScale(b, st)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_ = st.m.Sweep(ctx, st.now)
	}
	b.StopTimer()
	for i := range 100_000 / scaleRows {
		for k := range scaleRows {
			_, _, _ = st.m.WindDown(ctx, "/c", "i"+strconv.Itoa(i)+"-"+strconv.Itoa(k), "", nil, st.now)
		}
	}
}

// BenchmarkMemoryScaleWindDownRelease100k: 100,000 timed wind-downs of
// the scale store reach their deadline and the sweep frees them, then
// they are placed again (untimed). Reported as BenchmarkMemoryScaleDrop.
func BenchmarkMemoryScaleWindDownRelease100k(b *testing.B) {
	st := scaleFixture(b)
	ctx := context.Background()
	var deadline time.Time
	var lookup time.Duration
	memoryHoldRounds(b, st.m, directory.SetAfterDropBatch, func() time.Time {
		deadline = windDownScale(b, st)
		return deadline
	}, func() error {
		done := slowestLookupWhile(st.m, st.now, "i5000-50")
		err := st.m.Sweep(ctx, deadline)
		lookup = max(lookup, done())
		return err
	}, func() {
		if _, err := st.m.Placement(ctx, "/c", "i999-99", deadline); !errors.Is(err, directory.ErrNoPlacement) {
			b.Fatalf("unexpected placement after the wind-down's deadline: %v", err)
		}
		for i, reg := range st.regs[:100_000/scaleRows] {
			res, err := st.m.Register(ctx, reg, st.now)
			if err != nil {
				b.Fatalf("cannot place %d again: %v", i, err)
			}
			reg.PrevSessionID = res.SessionID
		}
	})
	directory.SetAfterDropBatch(st.m, nil)
	b.ReportMetric(float64(lookup.Microseconds()), "max-lookup-us")
}

// BenchmarkMemoryScaleSweepLapse: 10,000 sessions serving one namespace
// all lapse (a fleet-wide outage) and one sweep drops them, under one
// hold of the lock. Reported as BenchmarkMemoryDrop100k.
func BenchmarkMemoryScaleSweepLapse(b *testing.B) {
	ctx := context.Background()
	m := directory.NewMemory(time.Minute, time.Now())
	var now time.Time
	memoryHoldRounds(b, m, directory.SetAfterDropBatch, func() time.Time {
		now = time.Now()
		for i := range scaleSessions {
			w := strconv.Itoa(i)
			if _, err := m.Register(ctx, &directory.Registration{ClientID: "w" + w, Sub: "s", Secret: "k", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:1/" + w, Headroom: 1}, now); err != nil {
				b.Fatal(err)
			}
		}
		now = now.Add(3 * time.Minute)
		return now
	}, func() error {
		return m.Sweep(ctx, now)
	}, func() {
		if ws, _ := m.Workers(ctx, now.Add(-3*time.Minute)); len(ws) != 0 {
			b.Fatalf("unexpected sessions after the sweep; got %d; want 0", len(ws))
		}
	})
}
