package metrics

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Prometheus's text parser (expfmt.TextParser) refuses a label value that
// is not valid UTF-8, and with it the whole scrape: one awkward namespace,
// store operation or build version lost every metric of the node. Every
// line written is valid UTF-8, and two values that differ only in their
// invalid bytes do not become one series twice.
func TestLabelValuesAreValidUTF8(t *testing.T) {
	m := New(Options{Version: "v1\xff"})
	m.Request([]byte("/bad\xffns"), 200, time.Millisecond)
	m.Request([]byte("/bad\xfens"), 200, time.Millisecond)
	m.StoreCommand("op\xc3", time.Millisecond, nil)
	exp := m.AppendPrometheus(context.Background(), nil)
	for i, line := range strings.Split(string(exp), "\n") {
		if !utf8.ValidString(line) {
			t.Errorf("unexpected line %d not valid UTF-8; got %q", i+1, line)
		}
	}
	got := scrape(t, m) // fails on a duplicate series
	want(t, got, "pinboard_proxy_requests_total{namespace=\"/bad\uFFFDns\",code=\"2xx\"}", "2")
	want(t, got, "pinboard_store_command_errors_total{op=\"op\uFFFD\"}", "0")
}

// A learned label value spelled like a fixed one (namespace "none" or
// "other", store operation "other") took a slot of its own: two series
// with the same labels in one scrape, which Prometheus refuses as
// duplicate samples. It counts in the fixed slot of that name.
func TestLearnedValueNamedLikeFixedSlot(t *testing.T) {
	m := New(Options{})
	m.Request([]byte("none"), 200, 0)
	m.Request([]byte("other"), 200, 0)
	m.Request(nil, 200, 0)
	m.StoreCommand("place", time.Millisecond, nil)
	m.StoreCommand("other", time.Millisecond, nil)
	got := scrape(t, m) // fails on a duplicate series
	want(t, got, `pinboard_proxy_requests_total{namespace="none",code="2xx"}`, "2")
	want(t, got, `pinboard_proxy_requests_total{namespace="other",code="2xx"}`, "1")
	want(t, got, `pinboard_store_command_duration_seconds_count{op="other"}`, "1")
}

// A histogram's _sum is a counter: it may never go down between scrapes
// (Prometheus reads a decrease as a restart). Kept in nanoseconds in a
// uint64 it wrapped after 2^64 ns (~584 years) of observed time in all:
// a busy node whose requests hold their answer for seconds (long polls)
// sums that in months.
func TestHistogramSumDoesNotWrap(t *testing.T) {
	h := newHistogram(proxyBuckets)
	const d = 100 * 365 * 24 * time.Hour // 100 years, 3.15e18 ns
	prev := 0.0
	for i := 1; i <= 10; i++ { // 31.5e18 ns in all: past 2^64
		h.Observe(d)
		_, sum := h.snapshot(nil)
		if sum < prev {
			t.Fatalf("unexpected _sum decrease after %d observations; got %v; want >= %v", i, sum, prev)
		}
		if want := float64(i) * d.Seconds(); math.Abs(sum-want) > want*1e-9 {
			t.Fatalf("unexpected _sum after %d observations; got %v; want %v", i, sum, strconv.FormatFloat(want, 'g', -1, 64))
		}
		prev = sum
	}
}

// Values that only alias a slot's label value (invalid bytes varied
// without end) are remembered up to a bound: the fast path's map does not
// grow with them.
func TestLabelAliasesBounded(t *testing.T) {
	m := New(Options{MaxNamespaces: 4})
	for i := 0; i < 1000; i++ {
		m.Request([]byte{'/', 'a', 0x80 + byte(i%64), byte(i / 64), 0xff}, 200, 0)
	}
	if n := len(*m.requests.idx.Load()); n > 3*len(m.requests.vals) {
		t.Fatalf("unexpected namespace index size; got %d; want <= %d", n, 3*len(m.requests.vals))
	}
}
