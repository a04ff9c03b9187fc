package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pinboard-go/pinboard/bench/relay"
)

// runRelay is `pinbench relay`: the floor the hot-ids scenario measures
// beside nginx and pinboard (package bench/relay says what it is and is
// not). It prints {"addr": …} once it accepts and runs until SIGTERM or
// SIGINT.
func runRelay(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pinbench relay", flag.ContinueOnError)
	mode := fs.String("mode", string(relay.Goroutine), "goroutine (a goroutine per connection, pinboard's I/O) or epoll (an event loop per CPU, nginx's shape)")
	listen := fs.String("listen", "127.0.0.1:0", "address to accept on")
	upstreams := fs.String("upstream", "", "comma-separated backend host:ports, one per client connection in turn")
	loops := fs.Int("loops", 0, "event loops of -mode epoll (0: one per CPU)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *upstreams == "" {
		fmt.Fprintln(stderr, "pinbench relay: -upstream is required")
		return 2
	}
	if *loops < 0 {
		fmt.Fprintf(stderr, "pinbench relay: -loops %d: want 0 or more\n", *loops)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := relay.Serve(ctx, relay.Options{
		Mode: relay.Mode(*mode), Listen: *listen, Upstreams: strings.Split(*upstreams, ","), Loops: *loops,
		Ready: func(addr string) {
			line, _ := json.Marshal(map[string]string{"addr": addr})
			fmt.Fprintf(stdout, "%s\n", line)
		},
	})
	if err != nil {
		fmt.Fprintf(stderr, "pinbench relay: %v\n", err)
		return 1
	}
	return 0
}
