package main

import (
	"path/filepath"

	"github.com/pinboard-go/pinboard/bench/plot"
	"github.com/pinboard-go/pinboard/bench/scenario"
)

var targets = []string{"direct", "nginx", "pinboard"}

// drawPlots writes the PNGs BENCHMARKS.md shows into dir.
func drawPlots(res *scenario.Results, dir string) ([]string, error) {
	var files []string
	spectra := []struct{ scn, phase, file, title, ylabel string }{
		{"hot", "latency", "hot-latency.png", "Hot ids: latency at a constant rate (open loop)", "latency (µs)"},
		{"cold", "latency", "cold-latency.png", "Cold placements: latency at a constant rate", "latency (µs)"},
		{"ws", "latency", "ws-latency.png", "WebSocket echo: round trip at a constant rate", "round trip (µs)"},
		{"sse", "delay", "sse-delay.png", "SSE: delivery delay per event", "delay (µs)"},
	}
	for _, s := range spectra {
		var series []plot.Series
		for _, t := range targets {
			if a := res.Aggregate(s.scn, s.phase, t); a.N > 0 {
				series = append(series, plot.Series{Name: t, Hist: a.Hist})
			}
		}
		if len(series) == 0 {
			continue
		}
		path := filepath.Join(dir, s.file)
		if err := plot.Spectrum(path, s.title, s.ylabel, series); err != nil {
			return nil, err
		}
		files = append(files, path)
	}
	var cats []string
	vals := make([][]float64, len(targets))
	for _, scn := range []string{"hot", "cold", "ws"} {
		if res.Aggregate(scn, "peak", "pinboard").N == 0 {
			continue
		}
		cats = append(cats, scn)
		for i, t := range targets {
			vals[i] = append(vals[i], res.Aggregate(scn, "peak", t).RPS)
		}
	}
	if len(cats) > 0 {
		path := filepath.Join(dir, "peaks.png")
		if err := plot.Bars(path, "Peak throughput (closed loop, 64 connections)", "requests / s", cats, targets, vals); err != nil {
			return nil, err
		}
		files = append(files, path)
	}
	return files, nil
}
