package scenario

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/fleet"
)

// proc is a child process: its own process group, killed with the harness
// (Pdeathsig), output in a log file under the results directory.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

// procs tracks every child so the run always cleans up.
type procs struct {
	mu  sync.Mutex
	all []*proc
	dir string
	// proxyCPU and fleetCPU are taskset CPU lists for the proxies and the
	// fleets; "" means every CPU (set explicitly: children would otherwise
	// inherit a pinned generator's affinity).
	proxyCPU, fleetCPU string
}

func allCPUs() string { return fmt.Sprintf("0-%d", runtime.NumCPU()-1) }

func (ps *procs) start(name, cpu string, env, argv []string, stdout io.Writer) (*proc, error) {
	if cpu == "" {
		cpu = allCPUs()
	}
	argv = append([]string{"taskset", "-c", cpu}, argv...)
	logf, err := os.Create(filepath.Join(ps.dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("cannot create the log of %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stderr = logf
	cmd.Stdout = logf
	if stdout != nil {
		cmd.Stdout = io.MultiWriter(logf, stdout)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("cannot start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logf, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.all = append(ps.all, p)
	ps.mu.Unlock()
	return p, nil
}

// pid is the measured process: the program itself, not a taskset wrapper
// (taskset execs it, keeping the pid).
func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
}

func (ps *procs) stopAll() {
	ps.mu.Lock()
	all := ps.all
	ps.all = nil
	ps.mu.Unlock()
	for i := len(all) - 1; i >= 0; i-- {
		all[i].stop(10 * time.Second)
	}
}

// cpu is the CPU time of this process and of every child still running
// (with their own children: nginx workers).
func (ps *procs) cpu() time.Duration {
	self, _ := bench.ReadProc(os.Getpid())
	total := self.CPU
	ps.mu.Lock()
	all := append([]*proc(nil), ps.all...)
	ps.mu.Unlock()
	for _, p := range all {
		if p.exited() {
			continue
		}
		if st, err := bench.ProcTree(p.pid()); err == nil {
			total += st.CPU
		}
	}
	return total
}

// freePort asks the kernel for a free 127.0.0.1 port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// pinboardNode is a running cmd/pinboard.
type pinboardNode struct {
	*proc
	addr  string // 127.0.0.1:port
	url   string
	token string
}

// benchToken is the worker and operator credential of every bench run.
const benchToken = "pinbench-token-not-a-secret"

// passport: one staticToken key for the fleet, anonymous clients, backends
// on 127.0.0.1 only.
const passport = `{"providers":[{"type":"staticToken","id":"pinboard","keys":[{"name":"pinbench","token":{"env":"PINBOARD_TOKEN"},` +
	`"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}}]}],` +
	`"namespaces":{"*":{"allow":"anonymous"}}}`

func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PINBOARD_") || k == "REDIS_URL" || k == "PORT" || k == "HOST" || k == "GOMAXPROCS" || k == "GOGC" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// startPinboard starts the binary with the Node pinboard's environment
// and waits for /livez; name is its process (and log file) name.
func (ps *procs) startPinboard(name, bin, redisURL string, extra []string) (*pinboardNode, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	env := append(baseEnv(),
		"PORT="+strconv.Itoa(port), "HOST=127.0.0.1",
		"PINBOARD_TOKEN="+benchToken, "PINBOARD_PASSPORT="+passport,
		"REDIS_URL="+redisURL, "PINBOARD_LOG_LEVEL=warn",
		// SSE streams hold a pooled worker connection each: thousands of
		// streams to one worker need more than the default 1024.
		"PINBOARD_UPSTREAM_MAX_CONNS=16384",
	)
	env = append(env, extra...)
	p, err := ps.start(name, ps.proxyCPU, env, []string{bin}, nil)
	if err != nil {
		return nil, err
	}
	n := &pinboardNode{proc: p, addr: "127.0.0.1:" + strconv.Itoa(port), token: benchToken}
	n.url = "http://" + n.addr
	if err := waitHTTP(p, n.url+"/livez", 200, 20*time.Second); err != nil {
		// The caller gets no node to stop: a node that never answered
		// (storm-split's second node, a Redis node skipped) would run,
		// and take CPU, until the run ends.
		p.stop(5 * time.Second)
		return nil, err
	}
	return n, nil
}

// waitHTTP polls url until it answers want.
func waitHTTP(p *proc, url string, want int, d time.Duration) error {
	deadline := time.Now().Add(d)
	c := &http.Client{Timeout: time.Second}
	var last string
	for time.Now().Before(deadline) {
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited before it was ready (%v); see its log", p.name, p.err)
		}
		resp, err := c.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %v: %s", url, d, last)
}

// fleetProc is a running `pinbench fleet`.
type fleetProc struct {
	*proc
	control string
	ports   []int
}

// startFleet starts a fleet process and waits until every worker
// registered (its ready line).
func (ps *procs) startFleet(name, pinbench, pinboardURL string, workers, listeners int, ns string, timeout time.Duration) (*fleetProc, error) {
	pr, pw := io.Pipe()
	env := append(baseEnv(), "PINBOARD_TOKEN="+benchToken)
	p, err := ps.start(name, ps.fleetCPU, env, []string{pinbench, "fleet",
		"-pinboard", pinboardURL, "-workers", strconv.Itoa(workers), "-listeners", strconv.Itoa(listeners),
		"-ns", ns, "-register-timeout", timeout.String()}, pw)
	if err != nil {
		return nil, err
	}
	var r struct {
		Control string `json:"control"`
		Ports   []int  `json:"ports"`
	}
	if err := awaitReady(p, pr, pw, &r, func() bool { return r.Control != "" }, timeout+10*time.Second, "registered"); err != nil {
		return nil, err
	}
	return &fleetProc{proc: p, control: r.Control, ports: r.Ports}, nil
}

// awaitReady waits for the JSON line on p's standard output (pr, the
// read side of pw) that decodes into v and makes ok true. what is the
// state the line announces, for the errors.
func awaitReady(p *proc, pr *io.PipeReader, pw *io.PipeWriter, v any, ok func() bool, timeout time.Duration, what string) error {
	got := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if json.Unmarshal(sc.Bytes(), v) == nil && ok() {
				close(got)
				break
			}
		}
		io.Copy(io.Discard, pr)
	}()
	go func() {
		<-p.done
		pw.Close()
	}()
	select {
	case <-got:
		return nil
	case <-p.done:
		return fmt.Errorf("%s exited before it %s (%v); see %s.log", p.name, what, p.err, p.name)
	case <-time.After(timeout):
		p.stop(5 * time.Second)
		return fmt.Errorf("%s not %s within %v", p.name, what, timeout)
	}
}

func (f *fleetProc) call(method, path string, out any) error {
	req, err := http.NewRequest(method, "http://"+f.control+path, nil)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("cannot call the fleet's %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("fleet %s answered %s", path, resp.Status)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (f *fleetProc) workers() ([]fleet.WorkerInfo, error) {
	var ws []fleet.WorkerInfo
	err := f.call("GET", "/workers", &ws)
	if err == nil && len(ws) == 0 {
		err = errors.New("fleet lists no workers")
	}
	return ws, err
}

func (f *fleetProc) stats(reset bool) (fleet.Snapshot, error) {
	var s fleet.Snapshot
	path := "/stats"
	if reset {
		path += "?reset=1"
	}
	return s, f.call("GET", path, &s)
}

// waitPlacements makes the cold-start quarantine happen (R-CS-1: the first
// placement attempt starts it) and waits until a placement succeeds.
func waitPlacements(ctx context.Context, pb *pinboardNode, path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	c := &http.Client{Timeout: 5 * time.Second}
	for time.Now().Before(deadline) {
		resp, err := c.Get(pb.url + path)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return fmt.Errorf("no placement through pinboard within %v", d)
}

// cpuOf reads a process's (and its children's: nginx workers) CPU time.
func cpuOf(pid int, tree bool) (bench.ProcStat, error) {
	if tree {
		return bench.ProcTree(pid)
	}
	return bench.ReadProc(pid)
}

// relayProc is a running `pinbench relay` (package bench/relay).
type relayProc struct {
	*proc
	addr string
}

// startRelay starts a relay of the given mode in front of the fleet's
// listeners and waits for its address; it runs on the proxies' CPUs, the
// epoll shape with loops event loops (nginx's worker_processes).
func (ps *procs) startRelay(name, pinbench, mode string, loops int, upstreamPorts []int) (*relayProc, error) {
	ups := make([]string, len(upstreamPorts))
	for i, p := range upstreamPorts {
		ups[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	pr, pw := io.Pipe()
	p, err := ps.start(name, ps.proxyCPU, baseEnv(), []string{pinbench, "relay", "-mode", mode,
		"-listen", "127.0.0.1:0", "-upstream", strings.Join(ups, ","), "-loops", strconv.Itoa(loops)}, pw)
	if err != nil {
		return nil, err
	}
	var r struct {
		Addr string `json:"addr"`
	}
	if err := awaitReady(p, pr, pw, &r, func() bool { return r.Addr != "" }, 10*time.Second, "listening"); err != nil {
		return nil, err
	}
	return &relayProc{proc: p, addr: r.Addr}, nil
}
