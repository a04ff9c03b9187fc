package plot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pinboard-go/pinboard/bench"
)

func TestNines(t *testing.T) {
	for p, want := range map[float64]float64{0: 0, 90: 1, 99: 2, 99.9: 3} {
		if got := nines(p); got < want-1e-9 || got > want+1e-9 {
			t.Fatalf("unexpected nines(%v); got %v; want %v", p, got, want)
		}
	}
}

func TestPlotsWritePNG(t *testing.T) {
	h := bench.NewHist()
	for i := 1; i <= 10000; i++ {
		h.Record(int64(i) * 1000)
	}
	if pts := spectrumPoints(h, 5); len(pts) == 0 || pts[len(pts)-1].X > 4+1e-9 {
		t.Fatalf("unexpected spectrum: %d points, last x %v (10,000 values support 4 nines)", len(pts), pts[len(pts)-1].X)
	}
	dir := t.TempDir()
	spec := filepath.Join(dir, "s.png")
	if err := Spectrum(spec, "t", "µs", []Series{{"a", h}, {"empty", bench.NewHist()}}); err != nil {
		t.Fatal(err)
	}
	bars := filepath.Join(dir, "b.png")
	if err := Bars(bars, "t", "req/s", []string{"hot", "ws"}, []string{"x", "y"}, [][]float64{{1, 2}, {3, 4}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{spec, bars} {
		b, err := os.ReadFile(f)
		if err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
			t.Fatalf("unexpected file %s: %v", f, err)
		}
	}
}
