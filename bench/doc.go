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
//   - httpgen.go: the HTTP/1.1 Doer, built on fasthttp's response parser,
//     and Transfer for large bodies.
//   - ws.go: a minimal RFC 6455 codec and the WebSocket echo Doer.
//   - sse.go: an allocation-free Server-Sent Events reader.
//   - procstat.go: utime+stime and RSS of a process, busy CPU of the
//     machine, from /proc.
//   - summary.go: percentiles, stored buckets and tables.
//   - progress.go: the progress line on stderr.
//
// Every connection the generator opens uses raw system calls
// (internal/rawio): the generator shares the machine with what it
// measures. The simulated worker fleet is package bench/fleet; the
// scenarios and the baselines (direct, nginx) are package bench/scenario;
// the plots are package bench/plot; the command is cmd/pinbench
// (make bench).
package bench
