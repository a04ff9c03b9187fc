package metrics

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/registry"
)

// sampleLine is one exposition sample: name, optional labels, value.
var sampleLine = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? [-+0-9.eE]+$|^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? (\+Inf|-Inf|NaN)$`)

// scrape returns the exposition as a map from "name{labels}" to value,
// checking every line's syntax and that each family is declared once.
func scrape(t *testing.T, m *Metrics) map[string]string {
	t.Helper()
	out := map[string]string{}
	types := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(string(m.AppendPrometheus(context.Background(), nil)), "\n"), "\n") {
		if strings.HasPrefix(line, "# TYPE ") {
			name := strings.Fields(line)[2]
			if types[name] {
				t.Fatalf("unexpected second TYPE line for %s", name)
			}
			types[name] = true
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		if !sampleLine.MatchString(line) {
			t.Fatalf("unexpected exposition line; got %q", line)
		}
		i := strings.LastIndexByte(line, ' ')
		if _, dup := out[line[:i]]; dup {
			t.Fatalf("unexpected duplicate series %s", line[:i])
		}
		out[line[:i]] = line[i+1:]
	}
	return out
}

func want(t *testing.T, got map[string]string, series, value string) {
	t.Helper()
	if v, ok := got[series]; !ok || v != value {
		t.Errorf("unexpected %s; got %q (present %v); want %q", series, v, ok, value)
	}
}

func TestCountersAndExposition(t *testing.T) {
	m := New(Options{Version: "test"})
	for i := 0; i < 3; i++ {
		m.Request([]byte("/counters"), 200, time.Millisecond)
	}
	m.Request([]byte("/counters"), 503, 2*time.Second)
	m.Request(nil, 404, time.Microsecond)
	m.Request([]byte(`/we"ird`), 204, 0)
	m.Request([]byte("/x"), 0, 0)
	m.UpstreamError("dial")
	m.UpstreamError("timeout")
	m.UpstreamError("nonsense")
	m.UpstreamError("unattested")
	m.Resolve(true)
	m.Resolve(true)
	m.Resolve(false)
	m.Placement(false)
	m.Placement(true)
	m.Heartbeat(3*time.Millisecond, "ok")
	m.Heartbeat(3*time.Millisecond, "voided")
	m.Probe(time.Millisecond, registry.ProbeOK)
	m.Probe(time.Millisecond, registry.ProbeMismatch)
	m.StoreCommand("place", 300*time.Microsecond, nil)
	m.StoreCommand("place", 300*time.Microsecond, errors.New("down"))
	m.StoreCommand("place", 0, errors.New("refused without a round trip"))

	got := scrape(t, m)
	want(t, got, `pinboard_proxy_requests_total{namespace="/counters",code="2xx"}`, "3")
	want(t, got, `pinboard_proxy_requests_total{namespace="/counters",code="5xx"}`, "1")
	want(t, got, `pinboard_proxy_requests_total{namespace="/counters",code="4xx"}`, "0")
	want(t, got, `pinboard_proxy_requests_total{namespace="none",code="4xx"}`, "1")
	want(t, got, `pinboard_proxy_requests_total{namespace="/we\"ird",code="2xx"}`, "1")
	want(t, got, `pinboard_proxy_requests_total{namespace="/x",code="other"}`, "1")
	want(t, got, `pinboard_proxy_request_duration_seconds_count`, "7")
	want(t, got, `pinboard_proxy_request_duration_seconds_bucket{le="0.0005"}`, "3")
	want(t, got, `pinboard_proxy_request_duration_seconds_bucket{le="0.001"}`, "6")
	want(t, got, `pinboard_proxy_request_duration_seconds_bucket{le="1"}`, "6")
	want(t, got, `pinboard_proxy_request_duration_seconds_bucket{le="2.5"}`, "7")
	want(t, got, `pinboard_proxy_request_duration_seconds_bucket{le="+Inf"}`, "7")
	want(t, got, `pinboard_proxy_request_duration_seconds_sum`, "2.003001")
	want(t, got, `pinboard_proxy_upstream_errors_total{kind="dial"}`, "1")
	want(t, got, `pinboard_proxy_upstream_errors_total{kind="timeout"}`, "1")
	want(t, got, `pinboard_proxy_upstream_errors_total{kind="other"}`, "1")
	want(t, got, `pinboard_proxy_upstream_errors_total{kind="pool"}`, "0")
	want(t, got, `pinboard_proxy_upstream_errors_total{kind="unattested"}`, "1")
	want(t, got, `pinboard_directory_lookups_total{result="hit"}`, "2")
	want(t, got, `pinboard_directory_lookups_total{result="miss"}`, "1")
	want(t, got, `pinboard_placements_total{kind="new"}`, "1")
	want(t, got, `pinboard_placements_total{kind="replaced"}`, "1")
	want(t, got, `pinboard_registry_heartbeats_total{outcome="ok"}`, "1")
	want(t, got, `pinboard_registry_heartbeats_total{outcome="voided"}`, "1")
	want(t, got, `pinboard_registry_heartbeat_duration_seconds_count`, "2")
	want(t, got, `pinboard_registry_probes_total{result="ok"}`, "1")
	want(t, got, `pinboard_registry_probes_total{result="mismatch"}`, "1")
	want(t, got, `pinboard_store_command_duration_seconds_count{op="place"}`, "2")
	want(t, got, `pinboard_store_command_duration_seconds_bucket{op="place",le="0.0005"}`, "2")
	want(t, got, `pinboard_store_command_errors_total{op="place"}`, "2")
	if _, ok := got[`pinboard_store_command_duration_seconds_count{op="other"}`]; ok {
		t.Errorf("unexpected op=\"other\" series without overflow")
	}
	want(t, got, `pinboard_build_info{version="test",goversion="`+runtimeVersion()+`"}`, "1")
	if _, ok := got["go_goroutines"]; !ok {
		t.Errorf("unexpected exposition without go_goroutines")
	}
}

func TestNamespaceCap(t *testing.T) {
	m := New(Options{MaxNamespaces: 2})
	for i := 0; i < 5; i++ {
		m.Request(fmt.Appendf(nil, "/ns%d", i), 200, 0)
	}
	m.Request([]byte("/ns0"), 200, 0)
	got := scrape(t, m)
	want(t, got, `pinboard_proxy_requests_total{namespace="/ns0",code="2xx"}`, "2")
	want(t, got, `pinboard_proxy_requests_total{namespace="/ns1",code="2xx"}`, "1")
	want(t, got, `pinboard_proxy_requests_total{namespace="other",code="2xx"}`, "3")
	if _, ok := got[`pinboard_proxy_requests_total{namespace="/ns2",code="2xx"}`]; ok {
		t.Errorf("unexpected series past the namespace cap")
	}
}

func TestWorkersByState(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := New(Options{Now: func() time.Time { return now }})
	m.Attach(Sources{
		Store: fakeStore{workers: []directory.SessionInfo{
			{LeaseUntil: now.Add(time.Second)},
			{LeaseUntil: now.Add(time.Second)},
			{LeaseUntil: now.Add(time.Second), Degraded: true},
			{LeaseUntil: now.Add(time.Second), Draining: true, Degraded: true},
			{LeaseUntil: now.Add(time.Second), Drain: directory.DrainState{Draining: true}},
			{LeaseUntil: now.Add(-time.Second), Draining: true},
		}, quarantine: 1500 * time.Millisecond},
		OpenStreams:      func() int64 { return 2 },
		OpenEventStreams: func() int64 { return 1 },
		OpenWebSockets:   func() int64 { return 1 },
		OpenConnections:  func() int64 { return 7 },
		RegistryQueue:    func() int { return 3 },
		RegistryRunning:  func() int { return 4 },
		RegistryCap:      func() int { return 12 },
	})
	got := scrape(t, m)
	want(t, got, `pinboard_directory_up`, "1")
	want(t, got, `pinboard_workers{state="healthy"}`, "2")
	want(t, got, `pinboard_workers{state="degraded"}`, "1")
	want(t, got, `pinboard_workers{state="draining"}`, "2")
	want(t, got, `pinboard_workers{state="expired"}`, "1")
	want(t, got, `pinboard_cold_start_quarantine_seconds`, "1.5")
	want(t, got, `pinboard_proxy_open_streams`, "2")
	want(t, got, `pinboard_proxy_open_event_streams`, "1")
	want(t, got, `pinboard_proxy_open_websockets`, "1")
	want(t, got, `pinboard_http_open_connections`, "7")
	want(t, got, `pinboard_registry_queue_depth`, "3")
	want(t, got, `pinboard_registry_running`, "4")
	want(t, got, `pinboard_registry_capacity`, "12")

	m.Attach(Sources{Store: fakeStore{err: errors.New("down")}})
	got = scrape(t, m)
	want(t, got, `pinboard_directory_up`, "0")
	if _, ok := got[`pinboard_workers{state="healthy"}`]; ok {
		t.Errorf("unexpected worker gauges while the store is down")
	}
}

// TestHotPathAllocs proves recording allocates nothing once a label value
// was learned (the proxy and registry call these on every request).
func TestHotPathAllocs(t *testing.T) {
	m := New(Options{})
	ns := []byte("/counters")
	m.Request(ns, 200, time.Millisecond)
	m.StoreCommand("lookup", time.Millisecond, nil)
	errDown := errors.New("down")
	allocs := testing.AllocsPerRun(1000, func() {
		m.Request(ns, 200, time.Millisecond)
		m.Request(nil, 404, time.Millisecond)
		m.UpstreamError("read")
		m.Resolve(true)
		m.Resolve(false)
		m.Placement(false)
		m.Placement(true)
		m.Heartbeat(time.Millisecond, "ok")
		m.Probe(time.Millisecond, registry.ProbeOK)
		m.StoreCommand("lookup", time.Millisecond, errDown)
	})
	if allocs != 0 {
		t.Fatalf("unexpected allocations on the hot path; got %v; want 0", allocs)
	}
	// Past the cap a new namespace must not allocate either.
	full := New(Options{MaxNamespaces: 1})
	full.Request([]byte("/a"), 200, 0)
	full.Request([]byte("/b"), 200, 0)
	allocs = testing.AllocsPerRun(1000, func() { full.Request([]byte("/c"), 200, 0) })
	if allocs != 0 {
		t.Fatalf("unexpected allocations past the namespace cap; got %v; want 0", allocs)
	}
}

type fakeStore struct {
	directory.Store
	workers    []directory.SessionInfo
	quarantine time.Duration
	err        error
}

func (f fakeStore) Workers(context.Context, time.Time) ([]directory.SessionInfo, error) {
	return f.workers, f.err
}

func (f fakeStore) Quarantine(context.Context, time.Time) (time.Duration, error) {
	return f.quarantine, f.err
}

// The stores list live sessions only, so sessions whose lease passed and
// that the sweep has not dropped yet are counted apart (directory.
// ExpiredCounter): pinboard_workers{state="expired"} over a real store.
func TestExpiredWorkersFromStore_RLS2(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const ttl = time.Second
	store := directory.NewMemory(ttl, now)
	for _, c := range []string{"a", "b"} {
		if _, err := store.Register(t.Context(), &directory.Registration{ClientID: c, Sub: "s", Secret: "k",
			Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:1/" + c, Headroom: 1}, now); err != nil {
			t.Fatal(err)
		}
	}
	m := New(Options{Now: func() time.Time { return now }})
	m.Attach(Sources{Store: store})
	want(t, scrape(t, m), `pinboard_workers{state="expired"}`, "0")
	now = now.Add(ttl + time.Millisecond) // both leases passed, not yet swept
	got := scrape(t, m)
	want(t, got, `pinboard_workers{state="expired"}`, "2")
	want(t, got, `pinboard_workers{state="healthy"}`, "0")
	now = now.Add(ttl)
	_ = store.Sweep(t.Context(), now)
	want(t, scrape(t, m), `pinboard_workers{state="expired"}`, "0")
}

// A superseded session's heartbeat (409 registration superseded, R-LS-4),
// an outcome the registry reports, counts under its own outcome, not as
// "other".
func TestSupersededHeartbeatOutcome_RLS4(t *testing.T) {
	m := New(Options{})
	m.Heartbeat(time.Millisecond, "superseded")
	got := scrape(t, m)
	want(t, got, `pinboard_registry_heartbeats_total{outcome="superseded"}`, "1")
	want(t, got, `pinboard_registry_heartbeats_total{outcome="other"}`, "0")
}

// Heartbeats the registry turned away before they ran count under their
// own outcomes, "busy" (pool full), "stale" (waited for the pool past
// the worker's timeout) and "stopping" (node shutting down), not as
// "other" (R-REG-2).
func TestRefusedHeartbeatOutcomes_RREG2(t *testing.T) {
	m := New(Options{})
	m.Heartbeat(time.Millisecond, "busy")
	m.Heartbeat(time.Millisecond, "busy")
	m.Heartbeat(time.Millisecond, "stale")
	m.Heartbeat(time.Millisecond, "stopping")
	got := scrape(t, m)
	want(t, got, `pinboard_registry_heartbeats_total{outcome="busy"}`, "2")
	want(t, got, `pinboard_registry_heartbeats_total{outcome="stale"}`, "1")
	want(t, got, `pinboard_registry_heartbeats_total{outcome="stopping"}`, "1")
	want(t, got, `pinboard_registry_heartbeats_total{outcome="other"}`, "0")
}

// The HELP of pinboard_proxy_upstream_errors_total names every kind it
// counts: "invalid" (a refused answer, 502 invalid answer from owner) and
// "other" were missing, and an operator reading the HELP in Prometheus
// could not tell what they count.
func TestUpstreamErrorsHelpNamesEveryKind(t *testing.T) {
	exp := string(New(Options{}).AppendPrometheus(t.Context(), nil))
	var help string
	for _, l := range strings.Split(exp, "\n") {
		if strings.HasPrefix(l, "# HELP pinboard_proxy_upstream_errors_total ") {
			help = l
		}
	}
	for _, k := range upstreamKinds {
		if !strings.Contains(help, k) {
			t.Errorf("unexpected HELP without kind %q: %s", k, help)
		}
	}
}

// The HELP of pinboard_http_open_connections names every connection it
// leaves out: event streams and unsized bodies to HTTP/1.0 clients are
// relayed off the server too (docs/OPERATIONS.md), and a HELP naming only
// WebSockets had an operator look for them among the connections.
func TestOpenConnectionsHelpNamesRelays(t *testing.T) {
	m := New(Options{})
	m.Attach(Sources{OpenConnections: func() int64 { return 0 }})
	var help string
	for _, l := range strings.Split(string(m.AppendPrometheus(t.Context(), nil)), "\n") {
		if strings.HasPrefix(l, "# HELP pinboard_http_open_connections ") {
			help = l
		}
	}
	for _, k := range []string{"WebSockets", "event streams", "HTTP/1.0"} {
		if !strings.Contains(help, k) {
			t.Errorf("unexpected HELP without %q; got %s; want every relayed connection named", k, help)
		}
	}
}
