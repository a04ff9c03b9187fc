package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"
)

// A multi-node fleet: several pinboard processes on one Redis directory
// (R-SRV-1: stateless nodes coordinating only through the store), with
// workers spread over them. Worker i registers and heartbeats through node
// i % len(Nodes); clients may use any node.

// MultiFleetOptions configures a multi-node fleet.
type MultiFleetOptions struct {
	RedisURL          string
	Nodes             int
	Workers           []string
	Headroom          int
	LeaseTTL          time.Duration
	HeartbeatInterval time.Duration
	LeaseBuffer       time.Duration
	WorkerEnv         []string // extra KEY=VALUE entries for every worker
	NodeEnv           []string // extra KEY=VALUE entries for every pinboard
}

// MultiFleet is running pinboard nodes sharing a Redis directory, and
// their workers.
type MultiFleet struct {
	Nodes   []*Pinboard
	Workers []*Worker
}

// StartMultiFleet starts the nodes and workers for this test, waits until
// every worker is registered, and kills everything in t.Cleanup (logging
// the output when the test failed).
func StartMultiFleet(t testing.TB, ctx context.Context, opts MultiFleetOptions) *MultiFleet {
	t.Helper()
	requireSuite(t)
	if _, err := pythonPath(); err != nil {
		t.Fatal(err)
	}
	f := &MultiFleet{}
	t.Cleanup(func() {
		f.kill()
		if t.Failed() {
			t.Logf("--- multi-node fleet output ---\n%s", f.Logs())
		}
	})
	nodes := make([]*Pinboard, opts.Nodes)
	errs := make([]error, opts.Nodes)
	var wg sync.WaitGroup
	for i := range opts.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			env := append([]string{"REDIS_URL=" + opts.RedisURL}, opts.NodeEnv...)
			nodes[i], errs[i] = startPinboard(PinboardOptions{LeaseTTL: opts.LeaseTTL, Env: env})
		}()
	}
	wg.Wait()
	for i, n := range nodes {
		if n != nil {
			f.Nodes = append(f.Nodes, n)
		} else {
			t.Fatalf("cannot start pinboard node %d: %v", i, errs[i])
		}
	}
	workers := make([]*Worker, len(opts.Workers))
	werrs := make([]error, len(opts.Workers))
	for i, name := range opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			workers[i], werrs[i] = startWorker(f.Nodes[i%len(f.Nodes)], WorkerOptions{
				Name: name, Headroom: opts.Headroom,
				HeartbeatInterval: opts.HeartbeatInterval, LeaseBuffer: opts.LeaseBuffer,
				Env: opts.WorkerEnv,
			})
		}()
	}
	wg.Wait()
	for i, w := range workers {
		if w == nil {
			t.Fatalf("cannot start worker %s: %v", opts.Workers[i], werrs[i])
		}
		f.Workers = append(f.Workers, w)
	}
	for _, w := range f.Workers {
		if _, err := w.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// WarmUp waits out the cold-start quarantine (R-CS-1) through node 0; the
// stamp is shared, so every node is warm afterwards.
func (f *MultiFleet) WarmUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*f.Nodes[0].LeaseTTL+10*time.Second)
	defer cancel()
	r, err := getWithRetry(ctx, f.Nodes[0].URL+"/counters/warmup/value")
	if err != nil || r.Status != http.StatusOK {
		return fmt.Errorf("cannot warm up the fleet: %s (err %v)", r, err)
	}
	return nil
}

// WorkerByURL maps an advertise URL to the worker's name.
func (f *MultiFleet) WorkerByURL(u string) string {
	for _, w := range f.Workers {
		if w.URL == u {
			return w.Name
		}
	}
	return ""
}

// Worker returns the worker called name.
func (f *MultiFleet) Worker(name string) *Worker {
	for _, w := range f.Workers {
		if w.Name == name {
			return w
		}
	}
	panic("BUG: no worker named " + name)
}

// Logs is every process's output.
func (f *MultiFleet) Logs() string {
	var b bytes.Buffer
	for _, n := range f.Nodes {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", n.proc.name, n.proc.out)
	}
	for _, w := range f.Workers {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", w.proc.name, w.proc.out)
	}
	return b.String()
}

func (f *MultiFleet) kill() {
	var wg sync.WaitGroup
	for _, n := range f.Nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.proc.kill() }()
	}
	for _, w := range f.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.proc.kill() }()
	}
	wg.Wait()
}

// PlacementRecord is GET /registry/placement.
type PlacementRecord struct {
	SessionID    string `json:"sessionId"`
	ClientID     string `json:"clientId"`
	AdvertiseURL string `json:"advertiseUrl"`
	Epoch        string `json:"epoch"`
	Live         bool   `json:"live"`
}

// Placement asks this node who owns /{ns}/{id}; ok is false on 404.
func (pb *Pinboard) Placement(ctx context.Context, ns, id string) (PlacementRecord, bool, error) {
	var p PlacementRecord
	q := url.Values{"namespace": {ns}, "id": {id}}
	r, err := do(ctx, http.MethodGet, pb.URL+"/registry/placement?"+q.Encode(), pb.operator(), nil)
	if err != nil {
		return p, false, err
	}
	switch r.Status {
	case http.StatusOK:
		return p, true, r.JSON(&p)
	case http.StatusNotFound:
		return p, false, nil
	}
	return p, false, fmt.Errorf("unexpected placement answer %s", r)
}

// postJSON sends an operator- or worker-scoped JSON body to this node.
func (pb *Pinboard) postJSON(ctx context.Context, path string, body any) (reply, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return reply{}, err
	}
	h := pb.operator()
	h.Set("Content-Type", "application/json")
	return do(ctx, http.MethodPost, pb.URL+path, h, bytes.NewReader(b))
}

// Drain and Undrain set the operator drain of a client id (R-REG-6).
func (pb *Pinboard) Drain(ctx context.Context, clientID string) error {
	return pb.expectOK(pb.postJSON(ctx, "/registry/drain", map[string]any{"clientId": clientID}))
}

func (pb *Pinboard) Undrain(ctx context.Context, clientID string) error {
	return pb.expectOK(pb.postJSON(ctx, "/registry/undrain", map[string]any{"clientId": clientID}))
}

// Release frees one placement as its session (R-REG-3), like a worker's
// idle eviction.
func (pb *Pinboard) Release(ctx context.Context, p PlacementRecord, ns, id string) error {
	return pb.expectOK(pb.postJSON(ctx, "/registry/release", []map[string]any{{
		"sessionId": p.SessionID, "namespace": ns, "id": id, "epoch": p.Epoch,
	}}))
}

func (pb *Pinboard) expectOK(r reply, err error) error {
	if err != nil {
		return err
	}
	if r.Status != http.StatusOK {
		return errors.New(r.String())
	}
	return nil
}

// whoamiAs is whoami for a client behind a trusted proxy: the node takes
// clientIP from X-Forwarded-For as the affinity key (R-PL-4).
func whoamiAs(ctx context.Context, pb *Pinboard, id, clientIP string) (string, reply, error) {
	r, err := doWithRetry(ctx, http.MethodGet, pb.URL+"/counters/"+id+"/whoami", http.Header{"X-Forwarded-For": {clientIP}})
	if err != nil {
		return "", r, err
	}
	var body struct {
		Worker string `json:"worker"`
		ID     string `json:"id"`
	}
	if r.Status != http.StatusOK || r.JSON(&body) != nil || body.ID != id {
		return "", r, fmt.Errorf("unexpected answer; got %s; want 200 from %s", r, id)
	}
	return body.Worker, r, nil
}

// parallel runs fn(i) for i in [0, n) on workers goroutines and returns
// the first error.
func parallel(n, workers int, fn func(i int) error) error {
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		next  = make(chan int)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}
