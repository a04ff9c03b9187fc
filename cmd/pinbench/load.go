package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/plot"
	"github.com/pinboard-go/pinboard/bench/scenario"
)

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// runLoad is `pinbench load`: one run against one URL, for ad hoc checks.
func runLoad(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pinbench load", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "host:port")
	path := fs.String("path", "/bench/alice/json", "request target; with -ids, {id} in it is replaced by h0, h1, …")
	ids := fs.Int("ids", 0, "spread requests over this many ids, h0 to h<ids-1> in turn, put where the -path has {id} (0: the -path as it is)")
	rate := fs.Float64("rate", 0, "open loop at this many requests per second; 0 runs closed loop")
	d := fs.Duration("d", 10*time.Second, "duration")
	c := fs.Int("c", 64, "connections")
	out := fs.String("json", "", "write the summary as JSON to this file")
	png := fs.String("plot", "", "draw the latency spectrum as a PNG to this file")
	var headers headerFlags
	fs.Var(&headers, "H", "extra header line (repeatable)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	// The Loop takes 0 workers as its default and a rate <= 0 as closed
	// loop: without these checks -c -3 ran 64 connections and -rate -5 a
	// closed loop, silently.
	switch {
	case *rate < 0:
		fmt.Fprintf(stderr, "pinbench load: -rate %v: want > 0 (open loop) or 0 (closed loop)\n", *rate)
		return 2
	case *c <= 0:
		fmt.Fprintf(stderr, "pinbench load: -c %d: want at least 1 connection\n", *c)
		return 2
	case *d <= 0:
		fmt.Fprintf(stderr, "pinbench load: -d %v: want a positive duration\n", *d)
		return 2
	case *ids < 0:
		fmt.Fprintf(stderr, "pinbench load: -ids %d: want 0 (the -path as it is) or more\n", *ids)
		return 2
	case *ids > 0 && !strings.Contains(*path, "{id}"):
		// Without the check -ids 1000 sent one path 1000 ways: a hot-id
		// run that was a single id.
		fmt.Fprintf(stderr, "pinbench load: -ids %d: the -path %q has no {id} to replace\n", *ids, *path)
		return 2
	}
	// One dial first: a wrong -addr is one clear line, not a table of
	// nothing but dial errors.
	conn, err := net.DialTimeout("tcp", *addr, 5*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "pinbench load: cannot reach -addr %s: %v\n", *addr, err)
		return 1
	}
	conn.Close()
	reqs := loadRequests(*addr, *path, *ids, headers)
	n := uint64(len(reqs))
	target := &bench.HTTPTarget{Addr: *addr, Request: func(dst []byte, seq uint64) []byte { return append(dst, reqs[seq%n]...) }}
	live := &bench.Live{}
	loop := &bench.Loop{Rate: *rate, Duration: *d, Workers: *c, Live: live}
	// Ctrl-C stops the run and still reports what it measured; a second
	// Ctrl-C (default handling again) kills it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()
	defer stop()
	p := bench.StartProgress(stderr, bench.IsTerminal(os.Stderr), "load "+*path, *d, live)
	res, err := loop.RunContext(ctx, target.NewDoer)
	p.Stop()
	if err != nil {
		fmt.Fprintf(stderr, "pinbench load: %v\n", err)
		return 1
	}
	s := bench.Summarize(res)
	if s.Interrupted {
		fmt.Fprintf(stderr, "pinbench load: interrupted after %s; the figures cover that part\n", s.Duration.Round(time.Millisecond))
	}
	// dropped: open-loop slots never sent (the generator fell behind past
	// its grace), which ErrorCount does not hold; a load that fell behind
	// printed "errors 0" and hid them.
	t := bench.Table{Header: []string{"mode", "req/s", "p50", "p90", "p99", "p99.9", "max", "errors", "dropped"}}
	t.Add(s.Mode, bench.FmtRate(s.RPS), bench.FmtUs(s.Latency.P50), bench.FmtUs(s.Latency.P90), bench.FmtUs(s.Latency.P99),
		bench.FmtUs(s.Latency.P999), bench.FmtUs(s.Latency.Max), fmt.Sprint(s.ErrorCount()), fmt.Sprint(s.Dropped))
	fmt.Fprint(stdout, t.Text())
	if len(s.Errors) > 0 {
		fmt.Fprintf(stdout, "errors: %v\n", s.Errors)
	}
	if *out != "" {
		b, err := json.MarshalIndent(s, "", "  ")
		if err == nil {
			err = os.WriteFile(*out, b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "pinbench load: cannot write -json %s: %v\n", *out, err)
			return 1
		}
	}
	if *png != "" && res.Latency.Count() > 0 {
		title := fmt.Sprintf("%s%s: latency (%s loop)", *addr, *path, s.Mode)
		if err := plot.Spectrum(*png, title, "latency (µs)", []plot.Series{{Name: *addr, Hist: res.Latency}}); err != nil {
			fmt.Fprintf(stderr, "pinbench load: cannot draw -plot %s: %v\n", *png, err)
			return 1
		}
	}
	switch {
	case s.OK == 0:
		fmt.Fprintf(stderr, "pinbench load: no request succeeded (%d sent)\n", s.Sent)
		return 1
	case s.Interrupted:
		return 130 // the shell's code for SIGINT
	}
	return 0
}

// loadRequests is the raw requests a load cycles through: the path as it
// is when ids is 0, else one per id with {id} replaced by h0…h<ids-1>
// (the names the run's hot-ids scenario uses), built before the run so
// the generator formats nothing per request.
func loadRequests(addr, path string, ids int, headers []string) [][]byte {
	if ids == 0 {
		return [][]byte{bench.AppendGET(nil, addr, []byte(path), headers...)}
	}
	out := make([][]byte, ids)
	for i := range out {
		p := strings.ReplaceAll(path, "{id}", scenario.HotID(i))
		out[i] = bench.AppendGET(nil, addr, []byte(p), headers...)
	}
	return out
}
