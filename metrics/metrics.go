// Package metrics is pinboard's Prometheus instrumentation: counters and
// histograms recorded on the data plane's hot path without locks or
// allocations, gauges computed at scrape time, and a writer for the
// Prometheus text exposition format (version 0.0.4).
//
// Why hand-written rather than a library: every label set here is small
// and fixed (status classes, error kinds, probe results) or bounded and
// learned once (namespaces, store operations), so a metric is an index
// into an array of atomic counters — no map lookup or string building per
// request. github.com/VictoriaMetrics/metrics has allocation-free
// counters, but its Prometheus-style histogram takes a mutex on every
// Update, which every proxied request would contend on;
// prometheus/client_golang is heavier still (a label-map lookup per
// observation, protobuf and many dependencies). The exposition writer is
// ~150 lines and needs no dependency.
//
// A *Metrics implements proxy.Metrics (guarded in package server, so that
// proxy's own tests may import this package), registry.Observer and
// directory.CommandObserver. All methods are safe for concurrent use.
package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/registry"
)

// DefaultMaxNamespaces bounds the namespace label (Options.MaxNamespaces).
const DefaultMaxNamespaces = 64

// Options configure Metrics. The zero value takes the defaults.
type Options struct {
	// MaxNamespaces is how many distinct namespaces get their own label
	// value; later ones count as namespace="other". Default 64.
	MaxNamespaces int
	// MaxStoreOps bounds the store operation label the same way; default 32.
	MaxStoreOps int
	// Now is the clock for scrape-time gauges; nil uses time.Now.
	Now func() time.Time
	// Version is reported by pinboard_build_info.
	Version string
}

// Sources are what scrape-time gauges read. Any nil field leaves its
// metrics out. Set them once with Attach, before the first scrape.
type Sources struct {
	// Store lists workers (pinboard_workers{state}) and the cold-start
	// quarantine.
	Store directory.Store
	// OpenStreams, OpenWebSockets: the proxy's streaming responses and
	// relayed WebSockets; OpenEventStreams: the Server-Sent Event streams
	// among OpenStreams.
	OpenStreams, OpenWebSockets, OpenEventStreams func() int64
	// OpenConnections: client connections to the public listener.
	OpenConnections func() int64
	// RegistryQueue, RegistryRunning, RegistryCap: the registry pool.
	RegistryQueue, RegistryRunning, RegistryCap func() int
}

// Status classes: index status/100; 0 collects anything outside 100..599.
const nClasses = 6

var classLabels = [nClasses]string{"other", "1xx", "2xx", "3xx", "4xx", "5xx"}

func statusClass(status int) int {
	c := status / 100
	if c < 1 || c > 5 {
		return 0
	}
	return c
}

// Namespace slots: 0 for requests never routed to a worker, 1 for
// namespaces past the cap, then one per namespace seen.
const (
	nsNone  = 0
	nsOther = 1
)

// Upstream error kinds (proxy.Metrics.UpstreamError).
var upstreamKinds = [...]string{"dial", "write", "read", "invalid", "timeout", "pool", "unattested", "ended", "other"}

func upstreamKind(kind string) int {
	for i, k := range upstreamKinds[:len(upstreamKinds)-1] {
		if k == kind {
			return i
		}
	}
	return len(upstreamKinds) - 1
}

// Heartbeat outcomes (registry.Observer.Heartbeat): every outcome the
// registry reports, superseded (R-LS-4) included, then other.
var heartbeatOutcomes = [...]string{"ok", "degraded", "auth", "bad_request", "unknown_session", "superseded", "forbidden", "voided", "unavailable", "busy", "stale", "stopping", "other"}

func heartbeatOutcome(o string) int {
	for i, k := range heartbeatOutcomes[:len(heartbeatOutcomes)-1] {
		if k == o {
			return i
		}
	}
	return len(heartbeatOutcomes) - 1
}

// Probe results, indexed by registry.ProbeResult.
var probeResults = [...]string{"ok", "unreachable", "rejected", "mismatch"}

// Metrics holds every pinboard metric. Create it with New.
type Metrics struct {
	opts  Options
	start time.Time

	// Data plane.
	requests   labelSet[[nClasses]atomic.Uint64] // by namespace
	latency    *histogram
	upstream   [len(upstreamKinds)]atomic.Uint64
	connects   atomic.Uint64
	cacheHit   atomic.Uint64
	cacheMiss  atomic.Uint64
	placed     atomic.Uint64
	replaced   atomic.Uint64
	heartbeats [len(heartbeatOutcomes)]atomic.Uint64
	hbLatency  *histogram
	probes     [len(probeResults)]atomic.Uint64
	prLatency  *histogram

	// Store round trips, by operation.
	store labelSet[storeOp]

	srcMu sync.Mutex
	src   Sources
}

// storeOp is one store operation's latency and errors.
type storeOp struct {
	latency *histogram
	errors  atomic.Uint64
}

// New returns Metrics with o's settings.
func New(o Options) *Metrics {
	if o.MaxNamespaces <= 0 {
		o.MaxNamespaces = DefaultMaxNamespaces
	}
	if o.MaxStoreOps <= 0 {
		o.MaxStoreOps = 32
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	m := &Metrics{
		opts:      o,
		start:     time.Now(),
		latency:   newHistogram(proxyBuckets),
		hbLatency: newHistogram(registryBuckets),
		prLatency: newHistogram(registryBuckets),
	}
	m.requests.init(o.MaxNamespaces, []string{"none", "other"}, nil)
	m.store.init(o.MaxStoreOps, []string{"other"}, func(v *storeOp) { v.latency = newHistogram(storeBuckets) })
	return m
}

// Attach sets the scrape-time sources. Call it once, before serving.
func (m *Metrics) Attach(s Sources) {
	m.srcMu.Lock()
	m.src = s
	m.srcMu.Unlock()
}

func (m *Metrics) sources() Sources {
	m.srcMu.Lock()
	defer m.srcMu.Unlock()
	return m.src
}

// Request implements proxy.Metrics: one finished data-plane request. ns is
// the namespace when the request reached resolution against a worker
// (bounded by what workers registered), nil otherwise.
func (m *Metrics) Request(ns []byte, status int, d time.Duration) {
	slot := nsNone
	if len(ns) > 0 {
		slot = m.requests.slot(ns, nsOther)
	}
	m.requests.at(slot)[statusClass(status)].Add(1)
	m.latency.Observe(d)
}

// UpstreamError implements proxy.Metrics.
func (m *Metrics) UpstreamError(kind string) { m.upstream[upstreamKind(kind)].Add(1) }

// UpstreamConnect implements proxy.Metrics.
func (m *Metrics) UpstreamConnect() { m.connects.Add(1) }

// Resolve implements proxy.Metrics: hit is a live placement found by the
// directory's cached lookup; a miss goes to the store to place.
func (m *Metrics) Resolve(hit bool) {
	if hit {
		m.cacheHit.Add(1)
	} else {
		m.cacheMiss.Add(1)
	}
}

// Placement implements proxy.Metrics.
func (m *Metrics) Placement(replaced bool) {
	if replaced {
		m.replaced.Add(1)
	} else {
		m.placed.Add(1)
	}
}

// Heartbeat implements registry.Observer.
func (m *Metrics) Heartbeat(d time.Duration, outcome string) {
	m.heartbeats[heartbeatOutcome(outcome)].Add(1)
	m.hbLatency.Observe(d)
}

// Probe implements registry.Observer.
func (m *Metrics) Probe(d time.Duration, r registry.ProbeResult) {
	if int(r) < len(m.probes) {
		m.probes[r].Add(1)
	}
	m.prLatency.Observe(d)
}

// QueueDepth implements registry.Observer. The depth is read from the pool
// at scrape time (Sources.RegistryQueue), so the per-request report is not
// needed.
func (m *Metrics) QueueDepth(int) {}

// StoreCommand implements directory.CommandObserver: one round trip to the
// store (a Redis command or script), by operation name.
func (m *Metrics) StoreCommand(op string, d time.Duration, err error) {
	v := m.store.at(m.store.slot(unsafeBytes(op), 0))
	if d > 0 { // 0: refused without a round trip (directory.CommandObserver)
		v.latency.Observe(d)
	}
	if err != nil {
		v.errors.Add(1)
	}
}

var (
	_ directory.CommandObserver = (*Metrics)(nil)
	_ registry.Observer         = (*Metrics)(nil)
)
