package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestBucketsAreContiguous(t *testing.T) {
	prevHi := int64(-1)
	for i := 0; i < histBuckets; i++ {
		lo, hi := bucketRange(i)
		if lo != prevHi+1 {
			t.Fatalf("unexpected gap before bucket %d; got lo %d; want %d", i, lo, prevHi+1)
		}
		if hi < lo {
			t.Fatalf("unexpected empty bucket %d: [%d, %d]", i, lo, hi)
		}
		if bucketIndex(lo) != i || bucketIndex(hi) != i {
			t.Fatalf("unexpected index for the ends of bucket %d [%d, %d]; got %d and %d", i, lo, hi, bucketIndex(lo), bucketIndex(hi))
		}
		// Precision: a bucket is never wider than 1/128 of its lowest value
		// (beyond the exact region).
		if lo >= 1<<histSubBits && float64(hi-lo+1) > float64(lo)/(1<<histSubBits) {
			t.Fatalf("unexpected bucket width at %d: [%d, %d]", i, lo, hi)
		}
		prevHi = hi
	}
	if prevHi != histMaxValue {
		t.Fatalf("unexpected top of range; got %d; want %d", prevHi, histMaxValue)
	}
}

func TestHistExactBelow128(t *testing.T) {
	h := NewHist()
	for v := int64(1); v <= 100; v++ {
		h.Record(v)
	}
	for _, c := range []struct {
		p    float64
		want int64
	}{{50, 50}, {99, 99}, {99.9, 100}, {100, 100}, {1, 1}, {0, 1}} {
		if got := h.Percentile(c.p); got != c.want {
			t.Fatalf("unexpected p%v; got %d; want %d", c.p, got, c.want)
		}
	}
	if h.Count() != 100 || h.Min() != 1 || h.Max() != 100 || h.Mean() != 50.5 {
		t.Fatalf("unexpected count/min/max/mean; got %d/%d/%d/%v", h.Count(), h.Min(), h.Max(), h.Mean())
	}
}

// TestHistPercentileBound: against an exact sort of random latencies,
// every percentile is never below the true value and at most 1/128 above.
func TestHistPercentileBound(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	h := NewHist()
	vals := make([]int64, 100_000)
	for i := range vals {
		// Log-normal-ish latencies from 10 µs to seconds.
		v := int64(math.Exp(r.NormFloat64()*1.5+11.5)) + 1
		vals[i] = v
		h.Record(v)
	}
	slices.Sort(vals)
	ps := []float64{1, 10, 50, 90, 99, 99.9, 99.99, 100}
	qs := h.Quantiles(ps)
	for i, p := range ps {
		rank := int(math.Round(p * float64(len(vals)) / 100)) // whole for these p and 100,000 values
		exact := vals[rank-1]
		got := h.Percentile(p)
		if got != qs[i] {
			t.Fatalf("unexpected Quantiles/Percentile disagreement at p%v; got %d and %d", p, qs[i], got)
		}
		if got < exact || float64(got) > float64(exact)*(1+1.0/(1<<histSubBits)) {
			t.Fatalf("unexpected p%v; got %d; want within [%d, %d·(1+1/128)]", p, got, exact, exact)
		}
	}
	var sum float64
	for _, v := range vals {
		sum += float64(v)
	}
	if mean := sum / float64(len(vals)); math.Abs(h.Mean()-mean) > 1e-6*mean {
		t.Fatalf("unexpected mean; got %v; want %v", h.Mean(), mean)
	}
}

func TestHistMergeEqualsRecordingAll(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	all, a, b := NewHist(), NewHist(), NewHist()
	for i := 0; i < 10_000; i++ {
		v := r.Int64N(50_000_000)
		all.Record(v)
		if i%3 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	a.Merge(b)
	a.Merge(NewHist()) // merging an empty histogram changes nothing
	if a.Count() != all.Count() || a.Min() != all.Min() || a.Max() != all.Max() || a.Mean() != all.Mean() {
		t.Fatalf("unexpected merge summary; got %d/%d/%d/%v; want %d/%d/%d/%v",
			a.Count(), a.Min(), a.Max(), a.Mean(), all.Count(), all.Min(), all.Max(), all.Mean())
	}
	for _, p := range []float64{50, 99, 99.9} {
		if a.Percentile(p) != all.Percentile(p) {
			t.Fatalf("unexpected merged p%v; got %d; want %d", p, a.Percentile(p), all.Percentile(p))
		}
	}
}

func TestHistClampAndEdges(t *testing.T) {
	h := NewHist()
	if h.Percentile(99) != 0 || h.Min() != 0 || h.Max() != 0 || h.Mean() != 0 {
		t.Fatal("unexpected non-zero summary of an empty histogram")
	}
	h.Record(-5)
	h.Record(math.MaxInt64)
	if h.Clamped() != 1 || h.Max() != histMaxValue || h.Min() != 0 {
		t.Fatalf("unexpected clamp; got clamped %d, max %d, min %d", h.Clamped(), h.Max(), h.Min())
	}
	h.RecordN(1000, 0)
	if h.Count() != 2 {
		t.Fatalf("unexpected count after RecordN(…, 0); got %d; want 2", h.Count())
	}
	h.Reset()
	if h.Count() != 0 || h.Max() != 0 {
		t.Fatal("unexpected values after Reset")
	}
	// A single value is reported as itself, not as its bucket's top.
	h.Record(1_234_567)
	if got := h.Percentile(50); got != 1_234_567 {
		t.Fatalf("unexpected p50 of one value; got %d; want 1234567", got)
	}
	var n uint64
	h.Buckets(func(hi int64, c uint64) { n += c })
	if n != 1 {
		t.Fatalf("unexpected bucket total; got %d; want 1", n)
	}
}

func BenchmarkHistRecord(b *testing.B) {
	h := NewHist()
	b.ReportAllocs()
	v := int64(12345)
	for b.Loop() {
		h.Record(v)
		v = v*7 + 13&0xffffff
	}
}

// TestHistPercentileOfAWholeRank: p99.9 of 1,000 values is the 999th, not
// the 1,000th — 99.9/100·1000 is 999.0000000000001 in floating point, and
// its ceiling is the next rank (the same for every count that is a
// multiple of 1,000: 60,000 SSE events, 195,000 open-loop requests).
func TestHistPercentileOfAWholeRank(t *testing.T) {
	for _, n := range []uint64{1000, 60_000, 195_000} {
		h := NewHist()
		h.RecordN(100, n-n/1000)     // exact: below 128
		h.RecordN(5_000_000, n/1000) // the top 0.1%
		if got := h.Percentile(99.9); got != 100 {
			t.Fatalf("unexpected p99.9 of %d values; got %v; want %v", n, got, 100)
		}
		if got := h.Quantiles([]float64{50, 99.9})[1]; got != 100 {
			t.Fatalf("unexpected Quantiles p99.9 of %d values; got %v; want %v", n, got, 100)
		}
		if got := h.Percentile(99.95); got != 5_000_000 {
			t.Fatalf("unexpected p99.95 of %d values; got %v; want %v", n, got, 5_000_000)
		}
	}
}
