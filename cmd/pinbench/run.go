package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pinboard-go/pinboard/bench/scenario"
)

// runBench is `pinbench run`: every scenario against direct, nginx and
// pinboard, then results.json, plots and BENCHMARKS.md.
func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pinbench run", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "short phases, one round, smaller fleets (5 to 7 minutes on 2 CPUs)")
	rounds := fs.Int("rounds", 0, "rounds per scenario (default 3, quick 1)")
	only := fs.String("scenarios", "", "comma-separated subset of "+strings.Join(scenario.Scenarios, ","))
	pinboardBin := fs.String("pinboard", "bin/pinboard", "pinboard binary")
	nginxBin := fs.String("nginx", "nginx", "nginx binary")
	out := fs.String("out", "", "results directory (default bench/results/<UTC time>)")
	markdown := fs.String("markdown", "BENCHMARKS.md", "BENCHMARKS.md to rewrite (empty: none)")
	plots := fs.String("plots", "docs/bench", "directory for the plots BENCHMARKS.md links (empty: results only)")
	proxyCPU := fs.String("proxy-cpu", "", "taskset CPU list for pinboard and nginx (empty: all)")
	fleetCPU := fs.String("fleet-cpu", "", "taskset CPU list for the fleets (empty: all)")
	genCPU := fs.String("gen-cpu", "", "taskset CPU list for the load generator (empty: all)")
	var pbEnv headerFlags
	fs.Var(&pbEnv, "pinboard-env", "extra KEY=VALUE for pinboard (repeatable), e.g. GOMAXPROCS=1")
	nginxWorkers := fs.Int("nginx-workers", 0, "nginx worker_processes (default: one per CPU of -proxy-cpu, or per CPU)")
	redis := fs.String("redis", "", "also run the Redis-store scenarios (hot ids on a Redis node, storm with a registry node apart): redis://… or auto")
	timeout := fs.Duration("timeout", 40*time.Minute, "abort the run after this long")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	switch {
	case *rounds < 0:
		fmt.Fprintf(stderr, "pinbench run: -rounds %d: want at least 1 (0: the default)\n", *rounds)
		return 2
	case *timeout <= 0:
		fmt.Fprintf(stderr, "pinbench run: -timeout %v: want a positive duration\n", *timeout)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "pinbench: %v\n", err)
		return 1
	}
	if *out == "" {
		*out = filepath.Join("bench", "results", time.Now().UTC().Format("20060102T150405Z"))
	}
	cfg := scenario.Config{
		Quick: *quick, Rounds: *rounds, PinboardBin: *pinboardBin, PinbenchBin: self, NginxBin: *nginxBin,
		OutDir: *out, Markdown: *markdown, PlotDir: *plots, NginxWorkers: *nginxWorkers,
		ProxyCPU: *proxyCPU, FleetCPU: *fleetCPU, GenCPU: *genCPU, PinboardEnv: pbEnv,
		RedisURL: *redis, Log: stderr, Plot: drawPlots,
	}
	if *only != "" {
		cfg.Scenarios = strings.Split(*only, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	start := time.Now()
	if _, err := scenario.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "pinbench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "pinbench: done in %s; results in %s\n", time.Since(start).Round(time.Second), *out)
	return 0
}
