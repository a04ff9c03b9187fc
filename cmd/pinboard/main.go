// Command pinboard is the pinboard control plane and data plane: configure
// it with the Node pinboard's environment (PORT, PINBOARD_PASSPORT,
// REDIS_URL, PINBOARD_LEASE_TTL_MS, …) and point workers and clients at it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/panjf2000/ants/v2"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/metrics"
	"github.com/pinboard-go/pinboard/server"
)

func main() {
	if isHelp(os.Args[1:]) {
		fmt.Fprint(os.Stdout, usage)
		return
	}
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stderr))
}

// usage is what pinboard --help prints: every variable loadConfig reads
// (TestUsageListsEveryVariable_RSRV3), for an operator with the binary or
// the image and no docs/OPERATIONS.md at hand.
const usage = `pinboard: the control plane and data plane for pinned workers.

Usage: pinboard    (no arguments: it is configured by environment variables)

Required:
  PINBOARD_PASSPORT   JSON passport: token providers, scopes, claims, namespace policies;
                      each key's token.env names the variable holding its token
                      (e.g. PINBOARD_TOKEN), which must be set
  REDIS_URL           memory: (one node, development), redis://, rediss://,
                      redis+cluster://, redis+sentinel://

Optional (default):
  HOST                                 public listener address (all interfaces)
  PORT                                 public listener port (8080)
  PINBOARD_BASE_PATH                   serve everything under this prefix (none)
  PINBOARD_LEASE_TTL_MS                worker lease and cold-start quarantine (15000)
  PINBOARD_AFFINITY_BALANCE_FACTOR     affinity bound, a number >= 1 (2)
  PINBOARD_TRUSTED_PROXIES             IPs/CIDRs whose X-Forwarded-For is believed (none)
  PINBOARD_PROBE_TIMEOUT_MS            challenge probe of a worker (2000)
  PINBOARD_REGISTRY_WORKERS            registry requests handled at once (64)
  PINBOARD_REGISTRY_MIN_WORKERS        registry governor's floor (4 x GOMAXPROCS)
  PINBOARD_REGISTRY_QUEUE              registry requests that may wait (4096)
  PINBOARD_UPSTREAM_MAX_CONNS          connections per worker (1024)
  PINBOARD_UPSTREAM_CONN_WAIT_MS       wait for a free worker connection (2000)
  PINBOARD_UPSTREAM_DIAL_TIMEOUT_MS    connecting to a worker (2000)
  PINBOARD_UPSTREAM_IDLE_MS            idle worker connections close after (2000)
  PINBOARD_UPSTREAM_HEADER_TIMEOUT_MS  wait for a worker's response header (300000)
  PINBOARD_STALL_TIMEOUT_MS            a streamed body making no progress; 0 off (60000)
  PINBOARD_READ_TIMEOUT_MS             reading one request body; 0 none (0)
  PINBOARD_HEADER_TIMEOUT_MS           reading a request header (30000)
  PINBOARD_IDLE_TIMEOUT_MS             idle client keep-alive connection (75000)
  PINBOARD_SHUTDOWN_DELAY_MS           serving on, /readyz 503, after SIGTERM (0)
  PINBOARD_SHUTDOWN_GRACE_MS           in-flight requests after that (25000)
  PINBOARD_METRICS_ADDR                admin listener host:port: /metrics, /livez,
                                       /readyz (off)
  PINBOARD_PPROF                       1: /debug/pprof/ on the admin listener (0)
  PINBOARD_LOG_FORMAT                  text or json (text)
  PINBOARD_LOG_LEVEL                   debug, info, warn or error (info)
  PINBOARD_ACCESS_LOG_SAMPLE           fraction of requests logged, 0 to 1 (0)

Every _MS variable is an integer number of milliseconds. A missing or bad value
prints one line naming the variable and exits 2 before anything listens.
SIGTERM or SIGINT starts a graceful shutdown (exit 0); a second one 200 ms or
more later exits at once (1): one sooner is taken for an echo of the first. All
of it, with limits and examples: docs/OPERATIONS.md.
`

// isHelp reports whether the arguments ask for usage: pinboard takes
// none, and any other is a configuration error (run).
func isHelp(args []string) bool {
	if len(args) != 1 {
		return false
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// serverOptions is the library's configuration for cfg: every variable
// that reaches the server goes through here (TestServerOptions).
func serverOptions(cfg *config, store directory.Store, log *slog.Logger, m *metrics.Metrics) server.Options {
	return server.Options{
		Store:              store,
		Passport:           cfg.Passport,
		BasePath:           cfg.BasePath,
		LeaseTTL:           cfg.LeaseTTL,
		BalanceFactor:      cfg.BalanceFactor,
		TrustedProxies:     cfg.Trusted,
		Upstream:           cfg.Upstream,
		ProbeTimeout:       cfg.ProbeTimeout,
		RegistryWorkers:    cfg.RegWorkers,
		RegistryMinWorkers: cfg.RegMinWorkers,
		RegistryQueue:      cfg.RegQueue,
		ReadTimeout:        cfg.ReadTimeout,
		IdleTimeout:        cfg.IdleTimeout,
		HeaderTimeout:      cfg.HeaderTimeout,
		Logger:             log,
		Metrics:            m,
		AccessLogSample:    cfg.AccessSample,
		Pprof:              cfg.Pprof,
		ShutdownDelay:      cfg.Delay,
	}
}

// run returns the exit code: 0 after a clean shutdown, 1 on a runtime
// failure, 2 on bad configuration (one line naming the variable, nothing
// started).
func run(args []string, lookup func(string) (string, bool), stderr io.Writer) int {
	// ants starts a default pool when imported, whose two goroutines wake
	// three times a second for as long as the process lives; pinboard
	// submits only to the registry's own pool (registry.New), so an idle
	// node stops them here.
	ants.Release()
	if len(args) > 0 {
		fmt.Fprintf(stderr, "pinboard: takes no arguments; configure it with environment variables (pinboard --help lists them)\n")
		return 2
	}
	read := map[string]bool{}
	cfg, err := loadConfig(func(name string) (string, bool) {
		read[name] = true
		return lookup(name)
	})
	if err != nil {
		fmt.Fprintf(stderr, "pinboard: %v\n", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	for _, w := range cfg.Passport.Warnings() {
		log.Warn("passport", "warning", w)
	}

	var m *metrics.Metrics
	if cfg.MetricsAddr != "" {
		m = metrics.New(metrics.Options{Version: version()})
	}
	// SIGTERM is a graceful shutdown from before the store opens: an
	// orchestrator that sees the port open (or /livez answer) may stop
	// the process at once, and one that gives up on a start still
	// waiting for Redis (up to storeOpenTimeout) stops it then. A signal
	// before Notify would kill it with the default action instead (exit
	// by signal, not 0).
	ctx, stop := signalContext(log)
	defer stop()
	store, err := openStore(ctx, cfg, log, m)
	if err != nil {
		var ce *configError
		if errors.As(err, &ce) {
			fmt.Fprintf(stderr, "pinboard: %v\n", err)
			return 2
		}
		if ctx.Err() != nil {
			log.Info("pinboard stopped before the directory opened")
			return 0
		}
		log.Error("cannot open the directory", "err", err)
		return 1
	}
	// The store closes while signals are still watched (deferred after
	// stop, so run first): a second signal then exits 1 as documented,
	// not by the signal's default action.
	closeStore := sync.OnceFunc(func() { _ = store.Close() })
	defer closeStore()

	pb, err := server.New(serverOptions(cfg, store, log, m))
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		log.Error("cannot listen", "addr", cfg.Addr, "err", err)
		return 1
	}
	// Once the configuration, the store and the public port are good: a
	// start refused for its configuration or its store (exit 2) says so
	// in one line, not after warnings about variables that did not make
	// it fail.
	for _, w := range unreadVars(environ(), read) {
		log.Warn("environment", "warning", w)
	}
	if cfg.MetricsAddr != "" {
		aln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			ln.Close()
			log.Error("cannot listen", "addr", cfg.MetricsAddr, "var", "PINBOARD_METRICS_ADDR", "err", err)
			return 1
		}
		paths := "/metrics /livez /readyz"
		if cfg.Pprof {
			paths += " /debug/pprof/"
		}
		log.Info("admin listening", "addr", aln.Addr().String(), "paths", paths)
		go func() {
			if err := pb.ServeAdmin(aln); err != nil {
				log.Error("admin listener failed", "err", err)
			}
		}()
	}
	log.Info("pinboard listening", "addr", ln.Addr().String(), "store", store.Name(), "leaseTtlMs", cfg.LeaseTTL.Milliseconds(),
		"basePath", cfg.BasePath, "shutdownDelayMs", cfg.Delay.Milliseconds(), "shutdownGraceMs", cfg.Grace.Milliseconds(), "version", version())

	if err := pb.Serve(ctx, ln, cfg.Grace); err != nil {
		log.Error("stopped with an error", "err", err)
		return 1
	}
	log.Info("pinboard stopped")
	return 0
}

// signalContext ends on the first SIGTERM or SIGINT, which starts the
// graceful shutdown; a second one exits at once with status 1, cutting
// whatever is still open (watchSignals).
func signalContext(log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go watchSignals(sigs, time.Now, cancel, os.Exit, log)
	return ctx, func() {
		signal.Stop(sigs)
		cancel()
	}
}

// signalEcho is how soon after the first signal a second one is taken as
// the same signal delivered twice, not as a second signal. GNU timeout
// (without --foreground) signals its child and then its whole process
// group, the child included, and a shell or supervisor that signals a
// process group does the same when the process's own parent passes the
// signal on: two SIGTERMs microseconds apart, and the graceful shutdown
// the first one started was cut by the second. An operator's second
// Ctrl-C comes later than this.
const signalEcho = 200 * time.Millisecond

// watchSignals cancels on the first signal from sigs and calls exit(1) on
// the next one that comes signalEcho or later after it.
func watchSignals(sigs <-chan os.Signal, now func() time.Time, cancel func(), exit func(int), log *slog.Logger) {
	s, ok := <-sigs
	if !ok {
		return
	}
	first := now()
	log.Info("shutting down", "signal", s.String())
	cancel()
	for s := range sigs {
		if now().Sub(first) < signalEcho {
			log.Debug("signal repeated right after the first: the same one", "signal", s.String())
			continue
		}
		log.Warn("second signal: exiting now", "signal", s.String())
		exit(1)
		return
	}
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// storeOpenTimeout bounds connecting to Redis at start: a start that
// fails on an unreachable store takes this long (deploy/systemd's start
// limit counts on it).
const storeOpenTimeout = 10 * time.Second

// openStore opens the directory REDIS_URL names (checkStoreURL already
// refused malformed URLs). An unreachable Redis is a runtime failure
// (exit 1: the orchestrator retries); one that refuses the connection's
// credentials or database (directory.ErrRefused) a configuration error
// (exit 2, at once).
//
// A Redis that refuses connections (down, restarting, not started yet at
// boot) fails a connection at once, not after a timeout: it is tried
// again until storeOpenTimeout, so that such a start takes as long as one
// waiting for an unreachable host. Failing at once, five starts
// RestartSec apart reached deploy/systemd's start limit within seconds,
// and pinboard stayed down after Redis came back.
func openStore(ctx context.Context, cfg *config, log *slog.Logger, m *metrics.Metrics) (directory.Store, error) {
	if cfg.RedisURL == "memory:" || cfg.RedisURL == "memory://" {
		return directory.NewMemory(cfg.LeaseTTL, time.Now()), nil
	}
	opts := directory.RedisOptions{LeaseTTL: cfg.LeaseTTL, Logger: log.With("component", "directory")}
	if m != nil {
		opts.Observer = m // a nil *Metrics must not become a non-nil interface
	}
	ctx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		store, err := directory.OpenRedis(ctx, cfg.RedisURL, opts)
		if err == nil {
			return store, nil
		}
		if errors.Is(err, directory.ErrRefused) {
			// Redis answered, and no retry mends its answer (a wrong
			// password, an ACL, a database out of range): a
			// configuration error, not an unreachable store.
			return nil, &configError{Var: "REDIS_URL", Err: err}
		}
		if !errors.Is(err, directory.ErrUnavailable) {
			return nil, err
		}
		if wait == 100*time.Millisecond {
			log.Warn("cannot reach the directory; retrying", "for", storeOpenTimeout.String(), "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// buildVersion is the release a build stamps with -ldflags
// "-X main.buildVersion=…" (deploy/Dockerfile's VERSION argument). An
// image is built without VCS data, so its module version is "(devel)",
// and every image reported that in pinboard_build_info and its logs.
var buildVersion string

// version is the stamped buildVersion, else the module version the binary
// was built from ("(devel)" for a source tree build).
func version() string {
	if buildVersion != "" {
		return buildVersion
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
