package bench

import (
	"strings"
	"testing"
)

func TestHistRoundTripThroughBuckets(t *testing.T) {
	h := NewHist()
	for v := int64(1000); v < 5_000_000; v = v*11/10 + 1 {
		h.RecordN(v, uint64(v%7+1))
	}
	g := HistOf(BucketsOf(h))
	if g.Count() != h.Count() {
		t.Fatalf("unexpected count after the round trip; got %d; want %d", g.Count(), h.Count())
	}
	for _, p := range []float64{50, 90, 99, 99.9} {
		// Stored buckets keep microsecond floats: the value may move by
		// less than a bucket.
		a, b := float64(h.Percentile(p)), float64(g.Percentile(p))
		if b < a*0.99 || b > a*1.01 {
			t.Fatalf("unexpected p%v after the round trip; got %v; want %v", p, b, a)
		}
	}
}

func TestTableRendering(t *testing.T) {
	tb := Table{Header: []string{"target", "rps"}}
	tb.Add("nginx", "20,000")
	tb.Add("pinboard", "25,000")
	md := tb.Markdown()
	if !strings.Contains(md, "| target | rps |\n|---|---:|\n| nginx | 20,000 |") {
		t.Fatalf("unexpected markdown; got %q", md)
	}
	txt := tb.Text()
	if !strings.Contains(txt, "pinboard  25,000") {
		t.Fatalf("unexpected text table; got %q", txt)
	}
}

func TestFmtUs(t *testing.T) {
	for v, want := range map[float64]string{87: "87µs", 1234: "1.23ms", 2_100_000: "2.10s"} {
		if got := FmtUs(v); got != want {
			t.Fatalf("unexpected FmtUs(%v); got %q; want %q", v, got, want)
		}
	}
}
