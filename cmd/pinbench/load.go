package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// runLoad is `pinbench load`: one run against one URL, for ad hoc checks.
func runLoad(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pinbench load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "host:port")
	path := fs.String("path", "/bench/alice/json", "request target")
	rate := fs.Float64("rate", 0, "open loop at this many requests per second; 0 runs closed loop")
	d := fs.Duration("d", 10*time.Second, "duration")
	c := fs.Int("c", 64, "connections")
	out := fs.String("json", "", "write the summary as JSON to this file")
	var headers headerFlags
	fs.Var(&headers, "H", "extra header line (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	req := bench.AppendGET(nil, *addr, []byte(*path), headers...)
	target := &bench.HTTPTarget{Addr: *addr, Request: func(dst []byte, _ uint64) []byte { return append(dst, req...) }}
	live := &bench.Live{}
	loop := &bench.Loop{Rate: *rate, Duration: *d, Workers: *c, Live: live}
	p := bench.StartProgress(stderr, bench.IsTerminal(os.Stderr), "load "+*path, *d, live)
	res, err := loop.Run(target.NewDoer)
	p.Stop()
	if err != nil {
		fmt.Fprintf(stderr, "pinbench load: %v\n", err)
		return 1
	}
	s := bench.Summarize(res)
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
		b, _ := json.MarshalIndent(s, "", "  ")
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintf(stderr, "pinbench load: %v\n", err)
			return 1
		}
	}
	return 0
}
