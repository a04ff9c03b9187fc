// Command pinbench is pinboard's benchmark harness (BENCHMARKS.md):
//
//	pinbench run [flags]     the scenarios and baselines; rewrites BENCHMARKS.md
//	pinbench fleet [flags]   a simulated worker fleet in its own process
//	pinbench load [flags]    one open- or closed-loop run against a URL
//	pinbench relay [flags]   the floor: a relay that does no HTTP work
//	pinbench report [flags]  BENCHMARKS.md again from a saved results.json
//
// `make bench` builds and runs `pinbench run`; `make bench BENCH_QUICK=1`
// runs a short version.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: pinbench <command> [flags]

  run      the scenarios against direct, nginx and pinboard; rewrites BENCHMARKS.md
  fleet    a simulated worker fleet in its own process
  load     one open- or closed-loop run against host:port (your own deployment)
  relay    the floor under the hot-ids figures: a Go relay that does no HTTP work
  report   BENCHMARKS.md and the plots again from a saved results.json

pinbench <command> -h lists the command's flags.
`

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "fleet":
		return runFleet(args[1:], stdout, stderr)
	case "load":
		return runLoad(args[1:], stdout, stderr)
	case "run":
		return runBench(args[1:], stdout, stderr)
	case "relay":
		return runRelay(args[1:], stdout, stderr)
	case "report":
		return runReport(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "pinbench: unknown command %q (want run, fleet, load, relay or report; see pinbench -h)\n", args[0])
		return 2
	}
}
