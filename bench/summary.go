package bench

import (
	"fmt"
	"strings"
	"time"
)

// Percentiles of one distribution, in microseconds.
type Percentiles struct {
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	P9999 float64 `json:"p9999"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
	Count uint64  `json:"count"`
}

// PercentilesOf summarises h (values in nanoseconds).
func PercentilesOf(h *Hist) Percentiles {
	q := h.Quantiles([]float64{50, 90, 99, 99.9, 99.99})
	return Percentiles{
		P50: us(q[0]), P90: us(q[1]), P99: us(q[2]), P999: us(q[3]), P9999: us(q[4]),
		Max: us(h.Max()), Mean: h.Mean() / 1e3, Count: h.Count(),
	}
}

func us(ns int64) float64 { return float64(ns) / 1e3 }

// Bucket is one histogram bucket as stored in results.json: the bucket's
// highest value in microseconds and its count.
type Bucket struct {
	HiUs  float64 `json:"hiUs"`
	Count uint64  `json:"n"`
}

// BucketsOf lists h's non-empty buckets.
func BucketsOf(h *Hist) []Bucket {
	var out []Bucket
	h.Buckets(func(hi int64, n uint64) { out = append(out, Bucket{us(hi), n}) })
	return out
}

// HistOf rebuilds a histogram from stored buckets (for merging rounds).
func HistOf(bs []Bucket) *Hist {
	h := NewHist()
	for _, b := range bs {
		h.RecordN(int64(b.HiUs*1e3), b.Count)
	}
	return h
}

// Summary is a LoopResult reduced to what tables and results.json keep.
type Summary struct {
	Mode    string            `json:"mode"`
	Rate    float64           `json:"rate,omitempty"`
	Workers int               `json:"workers"`
	Elapsed float64           `json:"elapsedS"`
	Sent    uint64            `json:"sent"`
	OK      uint64            `json:"ok"`
	Dropped uint64            `json:"dropped,omitempty"`
	Errors  map[string]uint64 `json:"errors,omitempty"`
	RPS     float64           `json:"rps"`
	Latency Percentiles       `json:"latencyUs"`
	Service Percentiles       `json:"serviceUs"`
	Slack   Percentiles       `json:"slackUs"`
	LatHist []Bucket          `json:"latencyHist,omitempty"`
	// Interrupted: the run was stopped early (Ctrl-C); the figures
	// cover the part that ran.
	Interrupted bool          `json:"interrupted,omitempty"`
	Duration    time.Duration `json:"-"`
}

// Summarize reduces r.
func Summarize(r *LoopResult) Summary {
	s := Summary{
		Mode: r.Mode, Rate: r.Rate, Workers: r.Workers, Elapsed: r.Elapsed.Seconds(),
		Sent: r.Sent, OK: r.OK, Dropped: r.Dropped, RPS: r.Throughput(),
		Latency: PercentilesOf(r.Latency), Service: PercentilesOf(r.Service), Slack: PercentilesOf(r.Slack),
		LatHist: BucketsOf(r.Latency), Duration: r.Duration, Interrupted: r.Interrupted,
	}
	if len(r.Errors) > 0 {
		s.Errors = r.Errors
	}
	return s
}

// ErrorCount is the number of failed requests.
func (s *Summary) ErrorCount() uint64 {
	var n uint64
	for _, v := range s.Errors {
		n += v
	}
	return n
}

// Table is a plain table rendered as Markdown (BENCHMARKS.md) or aligned
// text (the terminal summary).
type Table struct {
	Header []string
	Rows   [][]string
}

// Add appends a row.
func (t *Table) Add(cells ...string) { t.Rows = append(t.Rows, cells) }

// Markdown renders a GitHub table; the first column is left-aligned, the
// others right-aligned (numbers).
func (t *Table) Markdown() string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(t.Header, " | ") + " |\n|")
	for i := range t.Header {
		if i == 0 {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	return b.String()
}

// Text renders aligned columns.
func (t *Table) Text() string {
	w := make([]int, len(t.Header))
	for i, h := range t.Header {
		w[i] = len(h)
	}
	for _, r := range t.Rows {
		for i, c := range r {
			if i < len(w) && len(c) > w[i] {
				w[i] = len(c)
			}
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		for i, c := range cells {
			if i >= len(w) {
				break
			}
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", w[i], c)
			} else {
				fmt.Fprintf(&b, "  %*s", w[i], c)
			}
		}
		b.WriteString("\n")
	}
	line(t.Header)
	sep := make([]string, len(w))
	for i := range w {
		sep[i] = strings.Repeat("-", w[i])
	}
	line(sep)
	for _, r := range t.Rows {
		line(r)
	}
	return b.String()
}

// FmtUs formats microseconds compactly: "87µs", "1.23ms", "2.1s".
func FmtUs(v float64) string {
	switch {
	case v < 1000:
		return fmt.Sprintf("%.0fµs", v)
	case v < 1e6:
		return fmt.Sprintf("%.2fms", v/1e3)
	default:
		return fmt.Sprintf("%.2fs", v/1e6)
	}
}

// FmtRate formats a request rate with thousands separators.
func FmtRate(v float64) string { return thousands(int64(v + 0.5)) }
