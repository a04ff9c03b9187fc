// Package bench is pinboard's load harness (issue 5): an open-loop load
// generator that measures from each request's due time (no coordinated
// omission), a closed-loop mode for peak throughput, log-linear latency
// histograms, per-process CPU and RSS readings from /proc, and the result
// records cmd/pinbench writes as JSON, tables and plots.
//
// Files, one concern each:
//
//   - hist.go: the histogram (HdrHistogram's log-linear layout, 0.78%).
//   - loop.go: open- and closed-loop scheduling over per-connection Doers.
//   - httpgen.go: the HTTP/1.1 Doer, built on fasthttp's response parser.
//   - procstat.go: utime+stime and RSS of a process from /proc.
//   - progress.go: the progress line on stderr.
//
// The simulated worker fleet is package bench/fleet; the scenarios and the
// baselines (direct, nginx) are package bench/scenario.
package bench
