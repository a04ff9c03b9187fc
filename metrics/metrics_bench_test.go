package metrics

import (
	"testing"
	"time"
)

// BenchmarkRequest is what the proxy records per request: one counter and
// one histogram observation, from every core at once.
func BenchmarkRequest(b *testing.B) {
	m := New(Options{})
	ns := []byte("/counters")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Request(ns, 200, 750*time.Microsecond)
		}
	})
}

func BenchmarkHistogramObserve(b *testing.B) {
	h := newHistogram(proxyBuckets)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.Observe(750 * time.Microsecond)
		}
	})
}
