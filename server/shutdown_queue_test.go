package server

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// blockingWorkersStore is a memory store whose first Workers call waits
// until release closes: a store round trip holding the registry pool's
// only worker, so that the registry requests after it queue.
type blockingWorkersStore struct {
	*directory.Memory
	entered, release chan struct{}
	once             sync.Once
}

func (s *blockingWorkersStore) Workers(ctx context.Context, now time.Time) ([]directory.SessionInfo, error) {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.entered)
		<-s.release
	}
	return s.Memory.Workers(ctx, now)
}

// Registry requests queued for the pool when a shutdown starts each get
// an answer within the grace — the one running and the queued ones alike
// — not a connection closed under them (R-SRV-1: a node stopping in a
// rolling deploy; R-REG-7: a refusal is a 503 with Retry-After).
func TestShutdownAnswersQueuedRegistryRequests_RSRV1_RREG7(t *testing.T) {
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"T"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}]}]}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	store := &blockingWorkersStore{Memory: directory.NewMemory(DefaultLeaseTTL, time.Now()), entered: make(chan struct{}), release: make(chan struct{})}
	pb, err := New(Options{Store: store, Passport: pp, RegistryWorkers: 1, RegistryMinWorkers: 1, RegistryQueue: 16})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serveUntilStopped(t, pb, ln, 5*time.Second)
	url := "http://" + ln.Addr().String() + "/registry/workers"

	const n = 6
	type result struct {
		status int
		err    error
	}
	results := make(chan result, n)
	send := func() {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer tok")
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
		res, err := c.Do(req)
		if err != nil {
			results <- result{err: err}
			return
		}
		res.Body.Close()
		results <- result{status: res.StatusCode}
	}
	go send()
	<-store.entered
	for range n - 1 {
		go send()
	}
	for deadline := time.Now().Add(5 * time.Second); pb.registry.QueueDepth() < n-1; {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected registry queue; got %d waiting; want %d", pb.registry.QueueDepth(), n-1)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	for !pb.stopping.Load() {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	close(store.release)
	for i := range n {
		r := <-results
		t.Logf("answer %d: %d %v", i, r.status, r.err)
		if r.err != nil || (r.status != http.StatusOK && r.status != http.StatusServiceUnavailable) {
			t.Errorf("unexpected answer %d to a registry request queued at shutdown; got %d %v; want 200 or 503", i, r.status, r.err)
		}
	}
	if err := <-stopped; err != nil {
		t.Errorf("unexpected shutdown error: %v", err)
	}
}
