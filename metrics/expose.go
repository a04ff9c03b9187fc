package metrics

import (
	"context"
	"io"
	"math"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/pinboard-go/pinboard/directory"
)

// ContentType is the Prometheus text exposition format this package writes.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// scrapeStoreTimeout bounds the store calls a scrape makes.
const scrapeStoreTimeout = 2 * time.Second

// WritePrometheus writes every metric in the text exposition format. The
// scrape-time gauges call the store (bounded by ctx and 2s); a store error
// sets pinboard_directory_up to 0 and leaves the worker gauges out.
func (m *Metrics) WritePrometheus(ctx context.Context, w io.Writer) error {
	_, err := w.Write(m.AppendPrometheus(ctx, nil))
	return err
}

// AppendPrometheus appends the exposition to dst.
func (m *Metrics) AppendPrometheus(ctx context.Context, dst []byte) []byte {
	e := &expo{b: dst}
	m.appendDataPlane(e)
	m.appendRegistry(e)
	m.appendStore(e)
	m.appendScrapeTime(ctx, e)
	m.appendProcess(e)
	return e.b
}

func (m *Metrics) appendDataPlane(e *expo) {
	e.family("pinboard_proxy_requests_total", "counter",
		"Data-plane requests by namespace and status class. namespace is \"none\" for requests never routed to a worker (bad path, auth, unknown namespace, placement refused) and \"other\" past the namespace cap.")
	m.requests.each(func(ns string, c *[nClasses]atomic.Uint64) {
		for cl := 1; cl < nClasses; cl++ {
			e.sample("pinboard_proxy_requests_total", "namespace", ns, "code", classLabels[cl], c[cl].Load())
		}
		if v := c[0].Load(); v > 0 {
			e.sample("pinboard_proxy_requests_total", "namespace", ns, "code", classLabels[0], v)
		}
	})
	e.histogram("pinboard_proxy_request_duration_seconds",
		"Time from a data-plane request's arrival until its response header is ready (streamed bodies relay afterwards and are not included).", m.latency)
	e.family("pinboard_proxy_upstream_errors_total", "counter", "Failures reaching a worker, by kind: dial (connect), write, read (its connection failed under its answer, a streamed body included), invalid (its answer refused for its framing, status line or header: 502 invalid answer from owner; a malformed chunk mid-stream), timeout (response header), pool (connection pool exhausted), unattested (the worker refused the attestation: not yet on its session), ended (its session ended while pinboard awaited its answer: 502 owner session ended), other.")
	for i, k := range upstreamKinds {
		e.sample("pinboard_proxy_upstream_errors_total", "kind", k, "", "", m.upstream[i].Load())
	}
	e.family("pinboard_proxy_upstream_connections_total", "counter", "Connections opened to workers (TCP connected, and TLS handshaken for https advertise URLs): pooled ones and WebSockets'. Growing with requests rather than with WebSockets and load means worker connections are not reused.")
	e.sample("pinboard_proxy_upstream_connections_total", "", "", "", "", m.connects.Load())
	e.family("pinboard_directory_lookups_total", "counter", "Data-plane resolutions: hit is a live placement found in the directory cache, miss went to the store to place.")
	e.sample("pinboard_directory_lookups_total", "result", "hit", "", "", m.cacheHit.Load())
	e.sample("pinboard_directory_lookups_total", "result", "miss", "", "", m.cacheMiss.Load())
	e.family("pinboard_placements_total", "counter", "New placements made by this node: kind=new, or kind=replaced when the id moved: off a worker that refused the activation in-band (R-PL-6) or declined it (host draining, instance capacity reached), or off an owner whose lease had passed while its row was kept (R-LS-2: a crashed or cut-off worker, within one lease of its expiry).")
	e.sample("pinboard_placements_total", "kind", "new", "", "", m.placed.Load())
	e.sample("pinboard_placements_total", "kind", "replaced", "", "", m.replaced.Load())
}

func (m *Metrics) appendRegistry(e *expo) {
	e.family("pinboard_registry_heartbeats_total", "counter", "Worker heartbeats by outcome.")
	for i, o := range heartbeatOutcomes {
		e.sample("pinboard_registry_heartbeats_total", "outcome", o, "", "", m.heartbeats[i].Load())
	}
	e.histogram("pinboard_registry_heartbeat_duration_seconds", "Time to handle one heartbeat, challenge probe included.", m.hbLatency)
	e.family("pinboard_registry_probes_total", "counter", "Challenge probes of worker advertise URLs (register and heartbeat) by result.")
	for i, r := range probeResults {
		e.sample("pinboard_registry_probes_total", "result", r, "", "", m.probes[i].Load())
	}
	e.histogram("pinboard_registry_probe_duration_seconds", "Challenge probe latency.", m.prLatency)
}

func (m *Metrics) appendStore(e *expo) {
	if m.store.learned() == 0 {
		return
	}
	e.family("pinboard_store_command_duration_seconds", "histogram", "Round trips to the directory store (Redis) by operation.")
	var buf []uint64
	m.store.each(func(op string, v *storeOp) {
		if op == "other" && v.latency.total() == 0 {
			return // nothing overflowed the operation cap
		}
		buf = e.histogramSamples("pinboard_store_command_duration_seconds", "op", op, v.latency, buf)
	})
	e.family("pinboard_store_command_errors_total", "counter", "Failed round trips to the directory store by operation.")
	m.store.each(func(op string, v *storeOp) {
		if n := v.errors.Load(); n > 0 || op != "other" {
			e.sample("pinboard_store_command_errors_total", "op", op, "", "", n)
		}
	})
}

// appendScrapeTime writes gauges read from their sources now.
func (m *Metrics) appendScrapeTime(ctx context.Context, e *expo) {
	s := m.sources()
	if s.Store != nil {
		c, cancel := context.WithTimeout(ctx, scrapeStoreTimeout)
		now := m.opts.Now()
		list, err := s.Store.Workers(c, now)
		var q time.Duration
		if err == nil {
			q, err = s.Store.Quarantine(c, now)
		}
		expired := 0
		if ec, ok := s.Store.(directory.ExpiredCounter); ok && err == nil {
			expired, err = ec.Expired(c, now)
		}
		cancel()
		e.family("pinboard_directory_up", "gauge", "1 when the directory store answered this scrape, 0 when it did not.")
		if err != nil {
			e.value("pinboard_directory_up", "", "", 0)
		} else {
			e.value("pinboard_directory_up", "", "", 1)
			var n [len(workerStates)]int
			for i := range list {
				n[workerState(&list[i], now)]++
			}
			n[3] += expired // Workers lists live sessions only
			e.family("pinboard_workers", "gauge", "Registered worker sessions by state: expired (lease passed, not yet swept), draining (own or operator drain), degraded (last challenge probe failed), healthy.")
			for i, st := range workerStates {
				e.value("pinboard_workers", "state", st, float64(n[i]))
			}
			e.family("pinboard_cold_start_quarantine_seconds", "gauge", "Remaining cold-start quarantine (R-CS-1); 0 once placements are allowed.")
			e.value("pinboard_cold_start_quarantine_seconds", "", "", q.Seconds())
		}
	}
	gauge := func(name, help string, f func() int64) {
		if f != nil {
			e.family(name, "gauge", help)
			e.value(name, "", "", float64(f()))
		}
	}
	gauge("pinboard_proxy_open_streams", "Streaming responses being relayed (Server-Sent Events, unsized or large bodies).", s.OpenStreams)
	gauge("pinboard_proxy_open_event_streams", "Server-Sent Event streams (text/event-stream) being relayed; counted in pinboard_proxy_open_streams too.", s.OpenEventStreams)
	gauge("pinboard_proxy_open_websockets", "WebSocket connections being relayed.", s.OpenWebSockets)
	gauge("pinboard_http_open_connections", "Client connections open on the public listener; those relayed off the HTTP server are excluded: WebSockets, event streams, unsized bodies to HTTP/1.0 clients (pinboard_proxy_open_streams and pinboard_proxy_open_websockets count them).", s.OpenConnections)
	if s.RegistryQueue != nil {
		gauge("pinboard_registry_queue_depth", "Registry requests waiting for a pool worker.", func() int64 { return int64(s.RegistryQueue()) })
	}
	if s.RegistryRunning != nil {
		gauge("pinboard_registry_running", "Registry requests being handled.", func() int64 { return int64(s.RegistryRunning()) })
	}
	if s.RegistryCap != nil {
		gauge("pinboard_registry_capacity", "Registry requests that may be handled at once (the governor moves it between PINBOARD_REGISTRY_MIN_WORKERS and PINBOARD_REGISTRY_WORKERS).", func() int64 { return int64(s.RegistryCap()) })
	}
}

var workerStates = [...]string{"healthy", "degraded", "draining", "expired"}

// workerState files a session under one state, the first that applies:
// expired, draining, degraded, healthy.
func workerState(s *directory.SessionInfo, now time.Time) int {
	switch {
	case !s.LeaseUntil.After(now):
		return 3
	case s.Draining || s.Drain.Draining:
		return 2
	case s.Degraded:
		return 1
	}
	return 0
}

// runtimeSamples are read with runtime/metrics (no stop-the-world).
var runtimeSamples = []struct{ key, name, typ, help string }{
	{"/sched/goroutines:goroutines", "go_goroutines", "gauge", "Goroutines that currently exist."},
	{"/memory/classes/heap/objects:bytes", "go_memstats_heap_alloc_bytes", "gauge", "Bytes of allocated heap objects."},
	{"/memory/classes/total:bytes", "go_memstats_sys_bytes", "gauge", "Bytes of memory obtained from the OS."},
	{"/gc/cycles/total:gc-cycles", "go_gc_cycles_total", "counter", "Completed GC cycles."},
	{"/sched/gomaxprocs:threads", "go_gomaxprocs", "gauge", "GOMAXPROCS."},
}

func (m *Metrics) appendProcess(e *expo) {
	samples := make([]rtmetrics.Sample, len(runtimeSamples))
	for i, r := range runtimeSamples {
		samples[i].Name = r.key
	}
	rtmetrics.Read(samples)
	for i, r := range runtimeSamples {
		var v float64
		switch samples[i].Value.Kind() {
		case rtmetrics.KindUint64:
			v = float64(samples[i].Value.Uint64())
		case rtmetrics.KindFloat64:
			v = samples[i].Value.Float64()
		default:
			continue
		}
		e.family(r.name, r.typ, r.help)
		e.value(r.name, "", "", v)
	}
	e.family("process_start_time_seconds", "gauge", "Start time of the process since the Unix epoch in seconds.")
	e.value("process_start_time_seconds", "", "", float64(m.start.UnixNano())/1e9)
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		e.family("process_open_fds", "gauge", "Open file descriptors.")
		e.value("process_open_fds", "", "", float64(len(ents)))
	}
	e.family("pinboard_build_info", "gauge", "Always 1; labels carry the build.")
	e.b = append(e.b, `pinboard_build_info{version="`...)
	e.b = appendEscaped(e.b, m.opts.Version)
	e.b = append(e.b, `",goversion="`...)
	e.b = appendEscaped(e.b, runtime.Version())
	e.b = append(e.b, "\"} 1\n"...)
}

// expo builds an exposition in a byte slice.
type expo struct{ b []byte }

func (e *expo) family(name, typ, help string) {
	e.b = append(e.b, "# HELP "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, strings.ReplaceAll(strings.ReplaceAll(help, `\`, `\\`), "\n", `\n`)...)
	e.b = append(e.b, "\n# TYPE "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, typ...)
	e.b = append(e.b, '\n')
}

func (e *expo) labels(k1, v1, k2, v2 string) {
	if k1 == "" {
		return
	}
	e.b = append(e.b, '{')
	e.b = append(e.b, k1...)
	e.b = append(e.b, `="`...)
	e.b = appendEscaped(e.b, v1)
	e.b = append(e.b, '"')
	if k2 != "" {
		e.b = append(e.b, ',')
		e.b = append(e.b, k2...)
		e.b = append(e.b, `="`...)
		e.b = appendEscaped(e.b, v2)
		e.b = append(e.b, '"')
	}
	e.b = append(e.b, '}')
}

// sample writes a counter sample with up to two labels.
func (e *expo) sample(name, k1, v1, k2, v2 string, v uint64) {
	e.b = append(e.b, name...)
	e.labels(k1, v1, k2, v2)
	e.b = append(e.b, ' ')
	e.b = strconv.AppendUint(e.b, v, 10)
	e.b = append(e.b, '\n')
}

// value writes a gauge sample with up to one label.
func (e *expo) value(name, k, v string, f float64) {
	e.b = append(e.b, name...)
	e.labels(k, v, "", "")
	e.b = append(e.b, ' ')
	e.b = appendFloat(e.b, f)
	e.b = append(e.b, '\n')
}

func (e *expo) histogram(name, help string, h *histogram) {
	e.family(name, "histogram", help)
	e.histogramSamples(name, "", "", h, nil)
}

// histogramSamples writes one histogram's _bucket, _sum and _count lines
// with an optional label.
func (e *expo) histogramSamples(name, k, v string, h *histogram, buf []uint64) []uint64 {
	buf, sum := h.snapshot(buf[:0])
	for i, c := range buf {
		le := "+Inf"
		if i < len(h.les) {
			le = h.les[i]
		}
		e.b = append(e.b, name...)
		e.b = append(e.b, "_bucket"...)
		if k != "" {
			e.labels(k, v, "le", le)
		} else {
			e.labels("le", le, "", "")
		}
		e.b = append(e.b, ' ')
		e.b = strconv.AppendUint(e.b, c, 10)
		e.b = append(e.b, '\n')
	}
	e.b = append(e.b, name...)
	e.b = append(e.b, "_sum"...)
	e.labels(k, v, "", "")
	e.b = append(e.b, ' ')
	e.b = appendFloat(e.b, sum)
	e.b = append(e.b, '\n')
	e.b = append(e.b, name...)
	e.b = append(e.b, "_count"...)
	e.labels(k, v, "", "")
	e.b = append(e.b, ' ')
	e.b = strconv.AppendUint(e.b, buf[len(buf)-1], 10)
	e.b = append(e.b, '\n')
	return buf
}

func appendFloat(b []byte, f float64) []byte {
	switch {
	case math.IsInf(f, 1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(f):
		return append(b, "NaN"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// appendEscaped escapes a label value: backslash, double quote and line
// feed (exposition format 0.0.4). A byte that is not part of valid UTF-8
// is written as U+FFFD: Prometheus refuses the whole scrape otherwise.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			if c < utf8.RuneSelf {
				b = append(b, c)
				continue
			}
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = utf8.AppendRune(b, utf8.RuneError)
				continue
			}
			b = append(b, s[i:i+n]...)
			i += n - 1
		}
	}
	return b
}

func runtimeVersion() string { return runtime.Version() }
