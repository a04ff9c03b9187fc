// Package plot draws the benchmark's PNG plots with gonum/plot: latency
// percentile spectra (HdrHistogram style: the x axis stretches the tail,
// 90%, 99%, 99.9%, … evenly spaced) and peak-throughput bars. It is kept
// apart from package bench so the harness's core does not link the
// plotting and font libraries.
package plot

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/pinboard-go/pinboard/bench"
)

// Series is one line of a spectrum plot.
type Series struct {
	Name string
	Hist *bench.Hist
}

// palette gives direct, nginx and pinboard stable, distinct colours.
var palette = []color.RGBA{
	{R: 0x55, G: 0x55, B: 0x55, A: 0xff}, // direct: grey
	{R: 0x00, G: 0x96, B: 0x39, A: 0xff}, // nginx: green
	{R: 0x1f, G: 0x5f, B: 0xd0, A: 0xff}, // pinboard: blue
	{R: 0xd0, G: 0x40, B: 0x20, A: 0xff},
	{R: 0x90, G: 0x30, B: 0xb0, A: 0xff},
}

// nines maps a percentile to the spectrum's x: -log10(1 - p/100), so 90%
// is 1, 99% is 2, 99.9% is 3.
func nines(p float64) float64 { return -math.Log10(1 - p/100) }

// spectrumPoints samples h at percentiles spread evenly on the nines axis
// up to maxNines (bounded by what the sample size supports).
func spectrumPoints(h *bench.Hist, maxNines float64) plotter.XYs {
	if h.Count() == 0 {
		return nil
	}
	top := math.Min(maxNines, math.Log10(float64(h.Count())))
	var ps []float64
	for x := 0.0; x <= top+1e-9; x += 0.02 {
		ps = append(ps, 100*(1-math.Pow(10, -x)))
	}
	vals := h.Quantiles(ps)
	pts := make(plotter.XYs, 0, len(ps))
	for i, p := range ps {
		v := float64(vals[i]) / 1e3 // µs
		if v <= 0 {
			v = 1
		}
		pts = append(pts, plotter.XY{X: nines(p), Y: v})
	}
	return pts
}

type ninesTicks struct{}

func (t ninesTicks) Ticks(lo, hi float64) []plot.Tick {
	labels := []string{"0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"}
	var out []plot.Tick
	for i := 0; i < len(labels) && float64(i) <= hi+1e-9; i++ {
		out = append(out, plot.Tick{Value: float64(i), Label: labels[i]})
	}
	return out
}

// Spectrum writes a latency percentile spectrum to path.
func Spectrum(path, title, ylabel string, series []Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = ylabel
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Tick.Marker = ninesTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, s := range series {
		pts := spectrumPoints(s.Hist, 5)
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("cannot plot %s: %w", s.Name, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// Bars writes grouped bars: one group per category, one bar per series.
func Bars(path, title, ylabel string, categories []string, series []string, values [][]float64) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	w := vg.Points(18)
	for i, name := range series {
		vs := make(plotter.Values, len(categories))
		copy(vs, values[i])
		b, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return fmt.Errorf("cannot plot %s: %w", name, err)
		}
		b.Color = palette[i%len(palette)]
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(b)
		p.Legend.Add(name, b)
	}
	p.NominalX(categories...)
	p.Y.Min = 0
	top := 0.0
	for _, vs := range values {
		for _, v := range vs {
			top = math.Max(top, v)
		}
	}
	p.Y.Max = top * 1.3 // room for the legend above the bars
	p.Y.Tick.Marker = countTicks{}
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(4)
	p.X.Padding = vg.Points(40)
	return p.Save(8*vg.Inch, 4*vg.Inch, path)
}

// countTicks labels a count axis without decimals: "25,000".
type countTicks struct{}

func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = bench.FmtRate(ts[i].Value)
		}
	}
	return ts
}

// Path joins dir and name (for callers building file lists).
func Path(dir, name string) string { return filepath.Join(dir, name) }
