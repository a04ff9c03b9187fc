package bench

import (
	"math"
	"math/bits"
)

// histSubBits sets the histogram's precision: 2^histSubBits buckets per
// power of two, so a recorded value is reported within 1/128 (0.78%) of
// itself. Values below 2^histSubBits are kept exactly.
const histSubBits = 7

// histMaxValue is the largest value kept; larger values are clamped (and
// counted in Clamped). 2^44 ns is about 4.9 hours.
const histMaxValue = 1<<44 - 1

var histBuckets = bucketIndex(histMaxValue) + 1

// Hist is a log-linear histogram of non-negative int64 values (nanoseconds
// in this package), in the manner of HdrHistogram: exact below 128, then 128
// linear sub-buckets per power of two. Min, max, count and sum are exact;
// percentiles are reported as the highest value of their bucket (never
// lower than the true value, at most 0.78% higher) and capped at Max.
//
// The zero value is not usable; call NewHist. A Hist is not safe for
// concurrent use: give each goroutine its own and Merge them.
type Hist struct {
	counts  []uint64
	total   uint64
	sum     float64
	min     int64
	max     int64
	clamped uint64
}

// NewHist returns an empty histogram.
func NewHist() *Hist {
	return &Hist{counts: make([]uint64, histBuckets), min: math.MaxInt64}
}

// bucketIndex maps v >= 0 to its bucket.
func bucketIndex(v int64) int {
	u := uint64(v)
	if u < 1<<histSubBits {
		return int(u)
	}
	shift := bits.Len64(u) - 1 - histSubBits
	return shift<<histSubBits + int(u>>uint(shift))
}

// bucketRange returns the lowest and highest value bucket i holds.
func bucketRange(i int) (lo, hi int64) {
	if i < 1<<histSubBits {
		return int64(i), int64(i)
	}
	shift := i>>histSubBits - 1
	m := int64(i - shift<<histSubBits)
	return m << uint(shift), (m+1)<<uint(shift) - 1
}

// Record adds one value. Negative values count as 0.
func (h *Hist) Record(v int64) { h.RecordN(v, 1) }

// RecordN adds n occurrences of v.
func (h *Hist) RecordN(v int64, n uint64) {
	if n == 0 {
		return
	}
	if v < 0 {
		v = 0
	}
	if v > histMaxValue {
		v = histMaxValue
		h.clamped += n
	}
	h.counts[bucketIndex(v)] += n
	h.total += n
	h.sum += float64(v) * float64(n)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// Merge adds every value recorded in o to h.
func (h *Hist) Merge(o *Hist) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.sum += o.sum
	h.clamped += o.clamped
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Reset empties the histogram.
func (h *Hist) Reset() {
	clear(h.counts)
	h.total, h.sum, h.min, h.max, h.clamped = 0, 0, math.MaxInt64, 0, 0
}

// Count is the number of recorded values.
func (h *Hist) Count() uint64 { return h.total }

// Clamped is how many values exceeded the histogram's range.
func (h *Hist) Clamped() uint64 { return h.clamped }

// Min is the smallest recorded value, 0 when empty.
func (h *Hist) Min() int64 {
	if h.total == 0 {
		return 0
	}
	return h.min
}

// Max is the largest recorded value, 0 when empty.
func (h *Hist) Max() int64 { return h.max }

// Mean is the exact mean, 0 when empty.
func (h *Hist) Mean() float64 {
	if h.total == 0 {
		return 0
	}
	return h.sum / float64(h.total)
}

// Percentile returns the value at or below which p percent of recorded
// values fall (0 < p <= 100): the highest value of the bucket holding the
// ceil(p/100*count)-th smallest value, capped at Max. 0 when empty.
func (h *Hist) Percentile(p float64) int64 {
	if h.total == 0 {
		return 0
	}
	if p <= 0 {
		return h.Min()
	}
	rank := rankOf(p, h.total)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bucketRange(i)
			return min(max(hi, h.min), h.max)
		}
	}
	return h.max
}

// rankOf is the 1-based rank of percentile p among n values,
// ceil(p/100·n) clamped to [1, n], computed in integers with p taken to
// 1e-7 of a percent: in floating point 99.9/100·1000 is
// 999.0000000000001, whose ceiling took the 1,000th of 1,000 values for
// p99.9 (and one rank too high for any count a multiple of 1,000).
func rankOf(p float64, n uint64) uint64 {
	const whole = 100 * 1e7 // 100% in units of 1e-7 %
	if p <= 0 {
		return 1
	}
	if p >= 100 {
		return n
	}
	hi, lo := bits.Mul64(uint64(math.Round(p*1e7)), n)
	lo, carry := bits.Add64(lo, whole-1, 0)
	rank, _ := bits.Div64(hi+carry, lo, whole)
	return min(max(rank, 1), n)
}

// Quantiles returns Percentile for each of ps in one pass over the buckets;
// ps must be ascending.
func (h *Hist) Quantiles(ps []float64) []int64 {
	out := make([]int64, len(ps))
	if h.total == 0 {
		return out
	}
	j := 0
	var seen uint64
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		seen += c
		for j < len(ps) {
			if seen < rankOf(ps[j], h.total) {
				break
			}
			_, hi := bucketRange(i)
			out[j] = min(max(hi, h.min), h.max)
			j++
		}
		if j == len(ps) {
			break
		}
	}
	for ; j < len(ps); j++ {
		out[j] = h.max
	}
	return out
}

// Buckets calls f for every non-empty bucket, lowest first, with the
// bucket's highest value and its count. It is how results are stored
// (results.json keeps the whole distribution).
func (h *Hist) Buckets(f func(hi int64, count uint64)) {
	for i, c := range h.counts {
		if c != 0 {
			_, hi := bucketRange(i)
			f(hi, c)
		}
	}
}
