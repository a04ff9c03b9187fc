package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pinboard-go/pinboard/bench/fleet"
)

// runFleet is `pinbench fleet`: a simulated worker fleet in its own
// process, so the proxy's CPU and the workers' are measured apart. It
// prints one JSON line {"control": addr, "ports": […]} on stdout once
// every worker registered, serves the control API (bench/fleet's
// ControlHandler) on addr, and deregisters everyone on SIGTERM.
func runFleet(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pinbench fleet", flag.ContinueOnError)
	pinboard := fs.String("pinboard", "http://127.0.0.1:8080", "pinboard URL the workers register with")
	workers := fs.Int("workers", 16, "virtual workers")
	listeners := fs.Int("listeners", 4, "listening ports the workers share")
	namespaces := fs.String("ns", "/bench", "comma-separated namespaces every worker serves")
	heartbeat := fs.Duration("heartbeat", 3*time.Second, "heartbeat interval")
	headroom := fs.Float64("headroom", 1000, "headroom every worker reports")
	control := fs.String("control", "127.0.0.1:0", "control API address (loopback)")
	regConc := fs.Int("register-concurrency", 32, "registrations in flight")
	regTimeout := fs.Duration("register-timeout", 5*time.Minute, "give up registering after this long")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	// bench/fleet takes zero values as its defaults: without these checks
	// -workers 0 printed its ports and served a fleet of nobody.
	switch {
	case *workers < 1 || *listeners < 1 || *regConc < 1:
		fmt.Fprintf(stderr, "pinbench fleet: -workers %d, -listeners %d, -register-concurrency %d: want at least 1 each\n", *workers, *listeners, *regConc)
		return 2
	case *heartbeat <= 0 || *regTimeout <= 0:
		fmt.Fprintf(stderr, "pinbench fleet: -heartbeat %v, -register-timeout %v: want positive durations\n", *heartbeat, *regTimeout)
		return 2
	}
	token := os.Getenv("PINBOARD_TOKEN")
	if token == "" {
		fmt.Fprintln(stderr, "pinbench fleet: PINBOARD_TOKEN is required (the worker credential)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	f, err := fleet.New(fleet.Options{
		PinboardURL: *pinboard, Token: token, Workers: *workers, Listeners: *listeners,
		Namespaces: strings.Split(*namespaces, ","), Heartbeat: *heartbeat, Headroom: *headroom,
		MaxWorkers: 2**workers + 4096, RegisterConcurrency: *regConc,
	})
	if err != nil {
		fmt.Fprintf(stderr, "pinbench fleet: %v\n", err)
		return 2
	}
	// The control address first: taken, it fails now, not after the
	// whole fleet registered (and then deregisters it).
	ln, err := net.Listen("tcp", *control)
	if err != nil {
		fmt.Fprintf(stderr, "pinbench fleet: cannot listen on -control %s: %v\n", *control, err)
		return 1
	}
	defer ln.Close()
	if err := f.Listen(); err != nil {
		fmt.Fprintf(stderr, "pinbench fleet: %v\n", err)
		return 1
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = f.Close(cctx)
	}()
	rctx, cancel := context.WithTimeout(ctx, *regTimeout)
	err = f.Register(rctx)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "pinbench fleet: %v\n", err)
		return 1
	}
	f.Run(ctx)
	srv := &http.Server{Handler: f.ControlHandler(ctx), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	line, _ := json.Marshal(map[string]any{"control": ln.Addr().String(), "ports": f.Ports()})
	fmt.Fprintf(stdout, "%s\n", line)
	<-ctx.Done()
	return 0
}
