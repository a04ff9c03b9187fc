package metrics

import (
	"strconv"
	"sync/atomic"
	"time"
)

// histogram is a Prometheus histogram of durations with fixed buckets.
// Observe is lock-free and allocation-free: one atomic add for the bucket,
// one for the sum. Buckets are stored non-cumulative and summed at scrape,
// so _count always equals the +Inf bucket.
//
// Safe for concurrent use; the zero value is unusable (use newHistogram).
type histogram struct {
	limits []int64         // bucket upper bounds in nanoseconds
	les    []string        // the same bounds rendered for the le label
	counts []atomic.Uint64 // len(limits)+1; the last is +Inf
	// sumUs is the sum of observations in microseconds, each rounded:
	// in nanoseconds a uint64 wrapped after 2^64 ns (~584 years) observed
	// in all, which a busy node sums in months, and _sum, a counter,
	// went down; in microseconds it takes ~584,000 years.
	sumUs atomic.Uint64
}

func newHistogram(bounds []time.Duration) *histogram {
	h := &histogram{
		limits: make([]int64, len(bounds)),
		les:    make([]string, len(bounds)),
		counts: make([]atomic.Uint64, len(bounds)+1),
	}
	for i, b := range bounds {
		if i > 0 && b <= bounds[i-1] {
			panic("BUG: histogram bounds must increase")
		}
		h.limits[i] = int64(b)
		h.les[i] = strconv.FormatFloat(b.Seconds(), 'g', -1, 64)
	}
	return h
}

// Observe records d. Negative durations count as zero.
func (h *histogram) Observe(d time.Duration) {
	n := int64(d)
	if n < 0 {
		n = 0
	}
	i := 0
	for i < len(h.limits) && n > h.limits[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumUs.Add(uint64(n/1000) + uint64(n%1000+500)/1000)
}

// snapshot returns cumulative bucket counts (the last is the total) and
// the sum in seconds.
func (h *histogram) snapshot(dst []uint64) ([]uint64, float64) {
	var acc uint64
	for i := range h.counts {
		acc += h.counts[i].Load()
		dst = append(dst, acc)
	}
	return dst, float64(h.sumUs.Load()) / 1e6
}

// Bucket sets, in seconds.
var (
	// proxyBuckets cover a warm in-process hop (sub-millisecond) up to a
	// worker that takes its time to answer.
	proxyBuckets = durations(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
	// registryBuckets cover heartbeats and challenge probes (the probe
	// timeout defaults to 2s).
	registryBuckets = durations(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
	// storeBuckets cover one Redis round trip.
	storeBuckets = durations(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
)

func durations(secs ...float64) []time.Duration {
	out := make([]time.Duration, len(secs))
	for i, s := range secs {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

// total is the number of observations.
func (h *histogram) total() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}
