package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Timing used by every fleet unless a test overrides it. The worker's lease
// turns unhealthy LeaseBuffer before expiry and then refuses new activations,
// so LeaseBuffer + HeartbeatInterval must stay well inside LeaseTTL.
const (
	defaultLeaseTTL          = 3 * time.Second
	defaultHeartbeatInterval = time.Second
	defaultLeaseBuffer       = time.Second

	buildTimeout     = 5 * time.Minute
	startTimeout     = 20 * time.Second // one process up and answering
	registerTimeout  = 20 * time.Second // a worker listed by /registry/workers
	stopTimeout      = 10 * time.Second // SIGTERM before SIGKILL
	killWaitTimeout  = 5 * time.Second
	startAttempts    = 3 // fresh ports after a bind failure
	logBufferMaxSize = 8 << 20
)

var (
	runDir string // per-run scratch directory, removed by TestMain

	buildOnce sync.Once
	buildPath string
	buildErr  error

	rootOnce sync.Once
	rootDir  string
	rootErr  error

	backstop procSet // every process started; TestMain kills the leftovers
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pinboard-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot create scratch dir: %v\n", err)
		os.Exit(2)
	}
	runDir = dir
	code := m.Run()
	closeSharedFleet()
	backstop.killAll()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireSuite skips under -short: the suite starts real processes.
func requireSuite(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: skipped with -short (starts pinboard and Python workers)")
	}
}

// moduleRoot is the directory holding go.mod, from `go env GOMOD`.
func moduleRoot() (string, error) {
	rootOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			rootErr = fmt.Errorf("cannot run go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			rootErr = errors.New("cannot find go.mod: go env GOMOD is empty")
			return
		}
		rootDir = filepath.Dir(gomod)
	})
	return rootDir, rootErr
}

// pinboardBinary builds ./cmd/pinboard once per test run and returns its
// path. PINBOARD_E2E_BINARY names a prebuilt binary instead.
func pinboardBinary() (string, error) {
	buildOnce.Do(func() {
		if bin := os.Getenv("PINBOARD_E2E_BINARY"); bin != "" {
			buildPath = bin
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		bin := filepath.Join(runDir, "pinboard")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/pinboard")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("cannot build ./cmd/pinboard: %w\n%s", err, out)
			return
		}
		buildPath = bin
	})
	return buildPath, buildErr
}

// pythonPath is the interpreter that has pinned==0.16.0, uvicorn and
// websockets: PINBOARD_E2E_PYTHON, else <repo>/.venv/bin/python.
func pythonPath() (string, error) {
	if p := os.Getenv("PINBOARD_E2E_PYTHON"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("PINBOARD_E2E_PYTHON=%q: %w", p, err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, ".venv", "bin", "python")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no Python for the workers at %s: run make test (it creates .venv with pinned==0.16.0), or set PINBOARD_E2E_PYTHON", p)
	}
	return p, nil
}

// ---------------------------------------------------------------------------
// Processes

// logBuffer collects a process's stdout and stderr, keeping the last
// logBufferMaxSize bytes. Safe for concurrent use.
type logBuffer struct {
	mu      sync.Mutex
	buf     []byte
	dropped int // bytes discarded from the front
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - logBufferMaxSize; over > 0 {
		over += logBufferMaxSize / 4
		b.buf = append(b.buf[:0], b.buf[over:]...)
		b.dropped += over
	}
	return len(p), nil
}

// Mark is the total byte count written so far, for Since.
func (b *logBuffer) Mark() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped + len(b.buf)
}

// Since returns what was written after mark (what is still kept of it).
func (b *logBuffer) Since(mark int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	off := mark - b.dropped
	if off < 0 {
		off = 0
	}
	if off > len(b.buf) {
		off = len(b.buf)
	}
	return string(b.buf[off:])
}

func (b *logBuffer) String() string { return b.Since(0) }

// proc is one child process. Its Wait runs in a goroutine that closes done.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{}
	err  error // Wait's result, valid after done is closed
}

func startProc(name, dir string, env, argv []string) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	out := &logBuffer{}
	cmd.Stdout = out
	cmd.Stderr = out
	// Pdeathsig: a test binary killed by -timeout takes its children along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	backstop.add(p)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

func (p *proc) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// stop sends SIGTERM, waits up to d, then SIGKILLs. It reports whether the
// process exited on SIGTERM alone.
func (p *proc) stop(d time.Duration) bool {
	p.signal(syscall.SIGTERM)
	if p.wait(d) {
		return true
	}
	p.kill()
	return false
}

func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	p.wait(killWaitTimeout)
}

// procSet tracks every started process so TestMain can kill leftovers.
type procSet struct {
	mu    sync.Mutex
	procs []*proc
}

func (s *procSet) add(p *proc) {
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
}

func (s *procSet) killAll() {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
}

// freePort asks the kernel for a free 127.0.0.1 port. Another process may
// take it before ours binds; callers retry on a bind failure. A port is
// handed out once per test binary: the kernel may offer a port it just
// gave back, and two parallel tests starting processes on the same port
// would see each other's health check answer (one process fails to bind
// while the other answers for it).
func freePort() (int, error) {
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("cannot listen on 127.0.0.1:0: %w", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if _, taken := handedOut.LoadOrStore(port, true); !taken {
			return port, nil
		}
	}
	return 0, errors.New("cannot find a port on 127.0.0.1 not handed out before")
}

// handedOut holds every port freePort returned (test-only state).
var handedOut sync.Map

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("BUG: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// scrubbedEnv is the parent's environment minus everything that would change
// what pinboard or a worker does: its own variables, proxies (all traffic
// stays on 127.0.0.1) and production markers (pinned refuses dev mode there).
func scrubbedEnv() []string {
	drop := map[string]bool{
		"REDIS_URL": true, "PORT": true, "HOST": true, "ADVERTISE_URL": true,
		"WORKER_NAME": true, "HEADROOM": true, "HEARTBEAT_INTERVAL": true,
		"LEASE_BUFFER": true, "NODE_ENV": true, "ENVIRONMENT": true, "APP_ENV": true,
		"HTTP_PROXY": true, "HTTPS_PROXY": true, "ALL_PROXY": true, "NO_PROXY": true,
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if drop[strings.ToUpper(k)] || strings.HasPrefix(k, "PINBOARD_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
}

func isBindFailure(out string) bool {
	out = strings.ToLower(out)
	return strings.Contains(out, "address already in use") || strings.Contains(out, "eaddrinuse")
}

// waitUp polls probe until it succeeds, the process exits, or d passes.
func waitUp(p *proc, d time.Duration, probe func(context.Context) error) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited before it was ready (%v)", p.name, p.err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		last = probe(ctx)
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %v: %v", p.name, d, last)
}

// ---------------------------------------------------------------------------
// Pinboard

// PinboardOptions configures one pinboard process. The zero value is a
// memory: store with defaultLeaseTTL.
type PinboardOptions struct {
	LeaseTTL time.Duration // PINBOARD_LEASE_TTL_MS; 0 means defaultLeaseTTL
	Env      []string      // extra KEY=VALUE entries, applied last
	// Token is PINBOARD_TOKEN; "" means a fresh random one. Nodes of one
	// deployment share it (one passport, one secret).
	Token string
	// Passport is PINBOARD_PASSPORT; "" means passportJSON(). Its tokens'
	// variables other than PINBOARD_TOKEN go in Env.
	Passport string
	// BasePath is PINBOARD_BASE_PATH ("/pb"); Pinboard.URL then ends with
	// it, so every request the tests and workers send goes under it.
	BasePath string
}

// Pinboard is a running pinboard process on 127.0.0.1.
type Pinboard struct {
	URL      string // http://127.0.0.1:PORT plus the base path, no trailing slash
	Token    string // PINBOARD_TOKEN: pinboard:worker and pinboard:operator
	LeaseTTL time.Duration
	proc     *proc
}

// passportJSON is the deployment passport: one staticToken key with both
// scopes, every namespace, backends on 127.0.0.1 only, anonymous clients.
func passportJSON() string {
	passport := map[string]any{
		"providers": []any{map[string]any{
			"type": "staticToken",
			"id":   "pinboard",
			"keys": []any{map[string]any{
				"name":   "e2e",
				"token":  map[string]any{"env": "PINBOARD_TOKEN"},
				"scopes": []string{"pinboard:worker", "pinboard:operator"},
				"claims": map[string]any{"pinboard": map[string]any{
					"namespaces":          []string{"*"},
					"allowedBackendHosts": []string{"127.0.0.1"},
				}},
			}},
		}},
		"namespaces": map[string]any{"*": map[string]any{"allow": "anonymous"}},
	}
	b, err := json.Marshal(passport)
	if err != nil {
		panic("BUG: cannot marshal passport: " + err.Error())
	}
	return string(b)
}

func startPinboard(opts PinboardOptions) (*Pinboard, error) {
	bin, err := pinboardBinary()
	if err != nil {
		return nil, err
	}
	ttl := opts.LeaseTTL
	if ttl == 0 {
		ttl = defaultLeaseTTL
	}
	token := opts.Token
	if token == "" {
		token = randomHex(24)
	}
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		env := append(scrubbedEnv(),
			"PORT="+strconv.Itoa(port),
			"HOST=127.0.0.1",
			"PINBOARD_TOKEN="+token,
			"PINBOARD_PASSPORT="+cmp.Or(opts.Passport, passportJSON()),
			"REDIS_URL=memory:",
			"PINBOARD_LEASE_TTL_MS="+strconv.FormatInt(ttl.Milliseconds(), 10),
		)
		if opts.BasePath != "" {
			env = append(env, "PINBOARD_BASE_PATH="+opts.BasePath)
		}
		env = append(env, opts.Env...)
		p, err := startProc(fmt.Sprintf("pinboard(:%d)", port), runDir, env, []string{bin})
		if err != nil {
			return nil, err
		}
		pb := &Pinboard{URL: "http://127.0.0.1:" + strconv.Itoa(port) + opts.BasePath, Token: token, LeaseTTL: ttl, proc: p}
		err = waitUp(p, startTimeout, func(ctx context.Context) error {
			r, err := do(ctx, http.MethodGet, pb.URL+"/registry/health", pb.operator(), nil)
			if err != nil {
				return err
			}
			if r.Status != http.StatusOK {
				return fmt.Errorf("GET /registry/health: %s", r)
			}
			return nil
		})
		if err == nil {
			return pb, nil
		}
		p.kill()
		lastErr = fmt.Errorf("%w\n--- pinboard output ---\n%s", err, p.out)
		if !isBindFailure(p.out.String()) {
			break
		}
	}
	return nil, lastErr
}

// StartPinboard starts a pinboard for this test; t.Cleanup kills it and, if
// the test failed, logs its output.
func StartPinboard(t testing.TB, opts PinboardOptions) *Pinboard {
	t.Helper()
	requireSuite(t)
	pb, err := startPinboard(opts)
	if err != nil {
		t.Fatalf("cannot start pinboard: %v", err)
	}
	t.Cleanup(func() {
		pb.proc.kill()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", pb.proc.name, pb.proc.out)
		}
	})
	return pb
}

// operator is the Authorization header of the deployment token.
func (pb *Pinboard) operator() http.Header {
	return http.Header{"Authorization": {"Bearer " + pb.Token}}
}

// Output is everything pinboard printed so far.
func (pb *Pinboard) Output() string { return pb.proc.out.String() }

// ---------------------------------------------------------------------------
// Workers

// WorkerOptions configures one worker_app.py process. Zero durations take the
// defaults above; Headroom 0 leaves pinned's memory probe in place.
type WorkerOptions struct {
	Name              string
	Headroom          int
	HeartbeatInterval time.Duration
	LeaseBuffer       time.Duration
	Env               []string
	// Port, when set, is the port to listen on (a worker restarted in
	// place); otherwise a free one.
	Port int
	// Stack is uvicorn's HTTP parser and event loop; the zero value is
	// stackH11.
	Stack WorkerStack
}

// WorkerStack is the HTTP stack a worker's uvicorn runs: its --http and
// --loop. Both are passed on every start, so a test runs the stack it
// names and not whatever is installed: with httptools and uvloop in the
// venv (tools/e2e/requirements.txt), uvicorn's "auto" picks them.
type WorkerStack struct {
	HTTP string // --http: h11 or httptools
	Loop string // --loop: asyncio or uvloop
}

var (
	// stackH11 is plain `pip install uvicorn`: the pure-Python h11
	// parser on asyncio's loop. Every test runs it unless it says.
	stackH11 = WorkerStack{HTTP: "h11", Loop: "asyncio"}
	// stackStandard is what `pip install uvicorn[standard]` runs by
	// default: the httptools C parser on uvloop.
	stackStandard = WorkerStack{HTTP: "httptools", Loop: "uvloop"}
)

func (s WorkerStack) orDefault() WorkerStack {
	if s == (WorkerStack{}) {
		return stackH11
	}
	return s
}

// Worker is a running worker_app.py process registered (or registering) with
// a pinboard.
type Worker struct {
	Name string
	Port int
	URL  string // ADVERTISE_URL: http://127.0.0.1:PORT
	pb   *Pinboard
	proc *proc
}

func startWorker(pb *Pinboard, opts WorkerOptions) (*Worker, error) {
	python, err := pythonPath()
	if err != nil {
		return nil, err
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	appDir := filepath.Join(root, "tools", "e2e")
	hb := opts.HeartbeatInterval
	if hb == 0 {
		hb = defaultHeartbeatInterval
	}
	buffer := opts.LeaseBuffer
	if buffer == 0 {
		buffer = defaultLeaseBuffer
	}
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		url := "http://127.0.0.1:" + strconv.Itoa(port)
		env := append(scrubbedEnv(),
			"PINBOARD_URL="+pb.URL,
			"PINBOARD_TOKEN="+pb.Token,
			"ADVERTISE_URL="+url,
			"WORKER_NAME="+opts.Name,
			"HEARTBEAT_INTERVAL="+strconv.FormatFloat(hb.Seconds(), 'f', -1, 64),
			"LEASE_BUFFER="+strconv.FormatFloat(buffer.Seconds(), 'f', -1, 64),
			"PYTHONUNBUFFERED=1",
		)
		if opts.Headroom != 0 {
			env = append(env, "HEADROOM="+strconv.Itoa(opts.Headroom))
		}
		env = append(env, opts.Env...)
		stack := opts.Stack.orDefault()
		argv := []string{python, "-m", "uvicorn", "worker_app:app",
			"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--log-level", "info",
			"--http", stack.HTTP, "--loop", stack.Loop}
		p, err := startProc(fmt.Sprintf("worker %s(:%d)", opts.Name, port), appDir, env, argv)
		if err != nil {
			return nil, err
		}
		w := &Worker{Name: opts.Name, Port: port, URL: url, pb: pb, proc: p}
		err = waitUp(p, startTimeout, func(ctx context.Context) error {
			r, err := do(ctx, http.MethodGet, url+"/healthz", nil, nil)
			if err != nil {
				return err
			}
			if r.Status != http.StatusOK {
				return fmt.Errorf("GET /healthz: %s", r)
			}
			return nil
		})
		if err == nil {
			return w, nil
		}
		p.kill()
		lastErr = fmt.Errorf("%w\n--- %s output ---\n%s", err, p.name, p.out)
		if opts.Port != 0 || !isBindFailure(p.out.String()) {
			break
		}
	}
	return nil, lastErr
}

// StartWorker starts a worker for this test; t.Cleanup kills it and, if the
// test failed, logs its output.
func StartWorker(t testing.TB, pb *Pinboard, opts WorkerOptions) *Worker {
	t.Helper()
	requireSuite(t)
	w, err := startWorker(pb, opts)
	if err != nil {
		t.Fatalf("cannot start worker %s: %v", opts.Name, err)
	}
	t.Cleanup(func() {
		w.proc.kill()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", w.proc.name, w.proc.out)
		}
	})
	return w
}

// Stop sends SIGTERM (uvicorn's graceful shutdown: pinned releases the
// worker's placements and deregisters), waits up to stopTimeout, then
// SIGKILLs. It reports whether the worker exited on SIGTERM alone.
func (w *Worker) Stop() bool { return w.proc.stop(stopTimeout) }

// Kill sends SIGKILL and waits for the process to go.
func (w *Worker) Kill() { w.proc.kill() }

// Output is everything the worker printed so far.
func (w *Worker) Output() string { return w.proc.out.String() }

// WaitRegistered polls GET /registry/workers until this worker's advertiseUrl
// is listed, and returns its record.
func (w *Worker) WaitRegistered(ctx context.Context) (WorkerRecord, error) {
	var last string
	for {
		recs, r, err := w.pb.Workers(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case r.Status != http.StatusOK:
			last = "GET /registry/workers: " + r.String()
		default:
			for _, rec := range recs {
				if rec.AdvertiseURL == w.URL {
					return rec, nil
				}
			}
			last = "GET /registry/workers: " + r.String()
		}
		if w.proc.exited() {
			return WorkerRecord{}, fmt.Errorf("%s exited before it registered (%v)", w.proc.name, w.proc.err)
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return WorkerRecord{}, fmt.Errorf("%s not listed by /registry/workers: %w; last: %s", w.Name, ctx.Err(), last)
		}
	}
}

// WaitUnregistered polls GET /registry/workers until this worker's
// advertiseUrl is gone.
func (w *Worker) WaitUnregistered(ctx context.Context) error {
	if err := waitUnlisted(ctx, w.pb, w.URL); err != nil {
		return fmt.Errorf("%s: %w", w.Name, err)
	}
	return nil
}

// waitUnlisted polls pb's GET /registry/workers until no record has
// advertise URL u, or ctx ends.
func waitUnlisted(ctx context.Context, pb *Pinboard, u string) error {
	var last string
	for {
		recs, r, err := pb.Workers(ctx)
		if err == nil && r.Status == http.StatusOK && !slices.ContainsFunc(recs, func(rec WorkerRecord) bool { return rec.AdvertiseURL == u }) {
			return nil
		}
		last = fmt.Sprintf("%s (err %v)", r, err)
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return fmt.Errorf("%s still listed by %s/registry/workers: %w; last: %s", u, pb.URL, ctx.Err(), last)
		}
	}
}

// LeaseFloor reads w's lease from the registry: it ends no sooner than
// the returned time (expiresInMs is computed after the request was sent,
// truncated to the millisecond, and later heartbeats only extend it). A
// test that kills w right after may not see its ids re-placed before it:
// one owner at a time (R-PL-1), however late w's last heartbeat came.
func (w *Worker) LeaseFloor(ctx context.Context) (time.Time, error) {
	sent := time.Now()
	recs, r, err := w.pb.Workers(ctx)
	if err != nil || r.Status != http.StatusOK {
		return time.Time{}, fmt.Errorf("cannot list workers: %s %v", r, err)
	}
	for _, rec := range recs {
		if rec.AdvertiseURL == w.URL && rec.ExpiresInMs != nil {
			return sent.Add(time.Duration(*rec.ExpiresInMs * float64(time.Millisecond))), nil
		}
	}
	return time.Time{}, fmt.Errorf("%s not listed by /registry/workers: %s", w.Name, r)
}

// ---------------------------------------------------------------------------
// Fleets: one pinboard and its workers

// FleetOptions configures a pinboard and len(Workers) workers hosting
// /counters and /tickers, all with the same headroom and timing.
type FleetOptions struct {
	LeaseTTL          time.Duration
	Workers           []string // names, e.g. w1, w2
	Headroom          int
	HeartbeatInterval time.Duration
	LeaseBuffer       time.Duration
	PinboardEnv       []string    // extra KEY=VALUE entries for pinboard
	Stack             WorkerStack // every worker's; zero is stackH11
	WorkerEnv         []string    // extra KEY=VALUE entries for every worker
}

// Fleet is a running pinboard with registered workers.
type Fleet struct {
	Pinboard *Pinboard
	Workers  []*Worker
	Records  map[string]WorkerRecord // registry record at start, by worker name
}

func startFleet(ctx context.Context, opts FleetOptions) (*Fleet, error) {
	if _, err := pythonPath(); err != nil {
		return nil, err // once, not per worker
	}
	pb, err := startPinboard(PinboardOptions{LeaseTTL: opts.LeaseTTL, Env: opts.PinboardEnv})
	if err != nil {
		return nil, err
	}
	f := &Fleet{Pinboard: pb, Records: map[string]WorkerRecord{}}
	type started struct {
		w   *Worker
		err error
	}
	results := make([]started, len(opts.Workers))
	var wg sync.WaitGroup
	for i, name := range opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := startWorker(pb, WorkerOptions{
				Name:              name,
				Headroom:          opts.Headroom,
				HeartbeatInterval: opts.HeartbeatInterval,
				LeaseBuffer:       opts.LeaseBuffer,
				Stack:             opts.Stack,
				Env:               opts.WorkerEnv,
			})
			results[i] = started{w, err}
		}()
	}
	wg.Wait()
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		f.Workers = append(f.Workers, r.w)
	}
	if len(errs) > 0 {
		f.kill()
		return nil, errors.Join(errs...)
	}
	for _, w := range f.Workers {
		rec, err := w.WaitRegistered(ctx)
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, f.Logs(nil))
			f.kill()
			return nil, err
		}
		f.Records[w.Name] = rec
	}
	return f, nil
}

// StartFleet starts a fleet owned by this test: t.Cleanup kills every process
// and, if the test failed, logs their output. The fleet is cold: its first
// placement attempt starts the R-CS-1 quarantine (see WarmUp).
func StartFleet(t testing.TB, ctx context.Context, opts FleetOptions) *Fleet {
	t.Helper()
	requireSuite(t)
	f, err := startFleet(ctx, opts)
	if err != nil {
		t.Fatalf("cannot start fleet: %v", err)
	}
	t.Cleanup(func() {
		f.kill()
		if t.Failed() {
			t.Logf("--- fleet output ---\n%s", f.Logs(nil))
		}
	})
	return f
}

// StartWarmFleet is StartFleet, then WarmUp: a fleet past its cold-start
// quarantine, whose ids place at once.
func StartWarmFleet(t testing.TB, ctx context.Context, opts FleetOptions) *Fleet {
	t.Helper()
	f := StartFleet(t, ctx, opts)
	if err := f.WarmUp(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

// Worker returns the fleet's worker by name.
func (f *Fleet) Worker(name string) *Worker {
	for _, w := range f.Workers {
		if w.Name == name {
			return w
		}
	}
	panic("BUG: no worker named " + name)
}

// Other returns the fleet's worker that is not name (two-worker fleets).
func (f *Fleet) Other(name string) *Worker {
	for _, w := range f.Workers {
		if w.Name != name {
			return w
		}
	}
	panic("BUG: no worker other than " + name)
}

// WarmUp waits out the cold-start quarantine (R-CS-1): it places
// /counters/warmup, retrying on 503 for up to two lease TTLs plus slack.
func (f *Fleet) WarmUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*f.Pinboard.LeaseTTL+10*time.Second)
	defer cancel()
	r, err := getWithRetry(ctx, f.Pinboard.URL+"/counters/warmup/value")
	if err != nil {
		return fmt.Errorf("cannot warm up the fleet: %w", err)
	}
	if r.Status != http.StatusOK {
		return fmt.Errorf("cannot warm up the fleet: GET /counters/warmup/value: %s", r)
	}
	return nil
}

// fleetMark records log positions so a shared fleet can print only what
// happened during one test.
type fleetMark map[*proc]int

func (f *Fleet) procs() []*proc {
	ps := []*proc{f.Pinboard.proc}
	for _, w := range f.Workers {
		ps = append(ps, w.proc)
	}
	return ps
}

func (f *Fleet) Mark() fleetMark {
	m := fleetMark{}
	for _, p := range f.procs() {
		m[p] = p.out.Mark()
	}
	return m
}

// Logs returns every process's output since mark (nil: everything).
func (f *Fleet) Logs(mark fleetMark) string {
	var b bytes.Buffer
	for _, p := range f.procs() {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", p.name, p.out.Since(mark[p]))
	}
	return b.String()
}

func (f *Fleet) kill() {
	var wg sync.WaitGroup
	for _, p := range f.procs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.kill()
		}()
	}
	wg.Wait()
}

// ---------------------------------------------------------------------------
// The shared fleet: w1 and w2 with equal headroom, warmed up, used by the
// tests that do not stop a worker. Started by the first test that asks,
// killed by TestMain after the last test.

var (
	sharedOnce sync.Once
	shared     *Fleet
	sharedErr  error
)

// sharedHeadroom is small so new placements (each subtracting one unit until
// the next heartbeat, R-PL-3) soon outweigh the per-client-IP preference and
// ids from 127.0.0.1 spread over both workers (R-PL-4).
const sharedHeadroom = 4

func sharedFleet(t testing.TB) *Fleet {
	t.Helper()
	requireSuite(t)
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		f, err := startFleet(ctx, FleetOptions{Workers: []string{"w1", "w2"}, Headroom: sharedHeadroom})
		if err != nil {
			sharedErr = err
			return
		}
		if err := f.WarmUp(ctx); err != nil {
			sharedErr = fmt.Errorf("%w\n%s", err, f.Logs(nil))
			f.kill()
			return
		}
		shared = f
	})
	if sharedErr != nil {
		t.Fatalf("cannot start the shared fleet: %v", sharedErr)
	}
	mark := shared.Mark()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- shared fleet output during %s ---\n%s", t.Name(), shared.Logs(mark))
		}
	})
	return shared
}

func closeSharedFleet() {
	if shared != nil {
		shared.kill()
	}
}

// wsMessage is one WebSocket message: its opcode and payload.
type wsMessage struct {
	op      byte
	payload []byte
}

// echoEach sends each message on c and fails the test unless the same
// message comes back next (an echo route, R-DP-2).
func echoEach(t *testing.T, c *wsConn, msgs []wsMessage) {
	t.Helper()
	for i, m := range msgs {
		if err := c.WriteMessage(m.op, m.payload); err != nil {
			t.Fatalf("message %d: cannot send: %v", i, err)
		}
		op, got, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("message %d: cannot read the echo: %v", i, err)
		}
		if op != m.op || string(got) != string(m.payload) {
			t.Fatalf("message %d: unexpected echo; got opcode %d, %d bytes; want opcode %d, %d identical bytes", i, op, len(got), m.op, len(m.payload))
		}
	}
}

// dialWebSocket opens a WebSocket through pinboard, retrying every retry
// while the upgrade is answered 503 (a placement not yet possible), and
// fails the test unless it opens.
func dialWebSocket(ctx context.Context, t *testing.T, url string, retry time.Duration) *wsConn {
	t.Helper()
	for {
		c, err := wsDial(ctx, url, nil)
		var he *wsHandshakeError
		if errors.As(err, &he) && he.Status == http.StatusServiceUnavailable && sleepCtx(ctx, retry) {
			continue
		}
		if err != nil {
			t.Fatalf("cannot open %s: %v", url, err)
		}
		return c
	}
}

// openEventStream GETs an SSE route, retrying every retry while pinboard
// answers 503 (a placement not yet possible, R-PL-3), and fails the test
// unless the stream opens: 200 with an event-stream Content-Type. The
// caller closes the body.
func openEventStream(ctx context.Context, t *testing.T, url string, retry time.Duration) *http.Response {
	t.Helper()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "text/event-stream")
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		if res.StatusCode == http.StatusServiceUnavailable {
			res.Body.Close()
			if !sleepCtx(ctx, retry) {
				t.Fatalf("GET %s: still 503 at the deadline", url)
			}
			continue
		}
		if res.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
			res.Body.Close()
			t.Fatalf("unexpected answer to GET %s; got %d %s; want 200", url, res.StatusCode, b)
		}
		if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Errorf("unexpected Content-Type of GET %s; got %q; want text/event-stream", url, ct)
		}
		return res
	}
}

// readEvents reads an event stream to its end and decodes each "data: "
// line's JSON into an E, with the time it arrived; it fails the test on
// a read or decode error.
func readEvents[E any](t *testing.T, body io.Reader) (events []E, arrived []time.Time) {
	t.Helper()
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			at := time.Now()
			var ev E
			if jerr := json.Unmarshal([]byte(data), &ev); jerr != nil {
				t.Fatalf("cannot decode event %q: %v", data, jerr)
			}
			events, arrived = append(events, ev), append(arrived, at)
		}
		if errors.Is(err, io.EOF) {
			return events, arrived
		}
		if err != nil {
			t.Fatalf("cannot read the event stream after %d events: %v", len(events), err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
