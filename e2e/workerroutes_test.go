package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// rawRequest sends method and target byte for byte (no client
// normalises the escapes) on a fresh connection and reads the answer.
func rawRequest(t *testing.T, base, method, target string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatalf("cannot dial %s: %v", base, err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: e2e\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method, target); err != nil {
		t.Fatalf("cannot send %s %s: %v", method, target, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("cannot read the answer to %s %s: %v", method, target, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("cannot read the body of the answer to %s %s: %v", method, target, err)
	}
	return res.StatusCode, string(b)
}

// A worker with a state store mounts POST <ns>/<id>/_wake
// (PinnedHost._mount_wake) for the Node pinboard's durable-resurrection
// sweeper. It activates the instance without running the route's
// authorize, which PinnedAPI.authorize promises runs before lifespan on a
// cold instance. Forwarded from a client with pinboard's attestation, it
// let anyone the namespace policy admits activate any id its worker would
// refuse them. The data plane answers it 404 in every spelling the
// worker's server decodes to that route — escapes in the namespace and
// the rest, and a trailing "%0A" (Starlette's route regex ends in "$",
// which matches before a final newline) — and the worker's guarded
// instance never activates.
func TestWakeRouteNotForwarded_RDP1(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pb := StartPinboard(t, PinboardOptions{})
	w := StartWorker(t, pb, WorkerOptions{Name: "d1", Headroom: 100, Env: []string{"STATE_STORE=memory"}})
	if _, err := w.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	// The cold-start quarantine (R-CS-1) ends before the probes.
	if r, err := getWithRetry(ctx, pb.URL+"/counters/warmup/value"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot warm up: %v %s", err, r)
	}
	// An instance route of the guarded namespace: authorize refuses it.
	if r, err := getWithRetry(ctx, pb.URL+"/guarded/alice/value"); err != nil || r.Status != http.StatusForbidden {
		t.Fatalf("unexpected answer to GET /guarded/alice/value; got %v %s; want 403 from authorize", err, r)
	}
	for _, target := range []string{
		"/guarded/alice/_wake",
		"/guarded/alice/_wake?x=1",
		"/guarded/alice/%5Fwake",
		"/guarded/alice/_w%61k%65",
		"/guarded/alice/_wake%0A",
		"/guarded/alice/_wake%0a?x=1",
		"/gu%61rded/alice/_wake",
	} {
		status, body := rawRequest(t, pb.URL, http.MethodPost, target)
		var e errorBody
		if status != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
			t.Errorf("unexpected answer to POST %s; got %d %s; want pinboard's 404", target, status, body)
		}
	}
	r, err := do(ctx, http.MethodGet, w.URL+"/_e2e/activations", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot read the worker's activations: %v %s", err, r)
	}
	var got struct {
		IDs []string `json:"ids"`
	}
	if err := r.JSON(&got); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(got.IDs, "alice") {
		t.Fatalf("unexpected activations on the worker; got %q; want none (authorize refuses every request)", got.IDs)
	}
}

// A worker may register the namespace "/_pinned" (PinnedHost takes any
// "/segment"), where its PinnedWorker serves its own routes. Forwarded
// with pinboard's attestation, which _verify_probe takes in place of the
// proxy secret, GET /_pinned/stats answered a client with every instance
// id the worker hosts, in every namespace. The data plane answers the
// namespace 404 however it is spelt; its ids are shadowed by the worker's
// routes anyway.
func TestWorkerNamespaceNotForwarded_RDP1(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pb := StartPinboard(t, PinboardOptions{})
	w := StartWorker(t, pb, WorkerOptions{Name: "p1", Headroom: 100, Env: []string{"EXTRA_NAMESPACE=/_pinned"}})
	rec, err := w.WaitRegistered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.Namespaces, "/_pinned") {
		t.Fatalf("unexpected namespaces; got %q; want /_pinned among them", rec.Namespaces)
	}
	if r, err := getWithRetry(ctx, pb.URL+"/counters/warmup/value"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot warm up: %v %s", err, r)
	}
	for _, target := range []string{
		"/_pinned/stats",
		"/_pinned/stats?x=1",
		"/%5Fpinned/stats",
		"/_pinned/alice/value",
	} {
		status, body := rawRequest(t, pb.URL, http.MethodGet, target)
		var e errorBody
		if status != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
			t.Errorf("unexpected answer to GET %s; got %d %s; want pinboard's 404", target, status, body)
		}
	}
}
