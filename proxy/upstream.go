package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// UpstreamOptions tune the connection pools to workers (R-DP-3). Zero
// values take the defaults documented on each field.
type UpstreamOptions struct {
	// MaxConns per worker advertise URL; default 1024. Past it a request
	// waits up to ConnWait for a free connection, then answers 503.
	MaxConns int
	// ConnWait is how long a request waits for a pooled connection;
	// default 2s.
	ConnWait time.Duration
	// DialTimeout bounds connecting to a worker; default 2s. A dead worker
	// fails fast: a refused connection returns at once.
	DialTimeout time.Duration
	// IdleTimeout closes pooled connections idle this long. It must stay
	// below the worker's keep-alive timeout (uvicorn: 5s) or a request can
	// be written onto a connection the worker is closing; default 2s.
	IdleTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a worker's response header
	// (not its body: streams may idle for hours); default 5m.
	ResponseHeaderTimeout time.Duration
	// BufferSize is the read and write buffer per connection, which also
	// caps a worker's response header size; default 16 KiB.
	BufferSize int
	// StallTimeout bounds how long a streamed body may make no progress
	// while pinboard has bytes to move: reading a client's upload,
	// writing it to the worker, writing a streamed response (SSE, a large
	// download) to a client that stopped reading. Without it one idle
	// upload or one client that never reads holds a worker connection
	// for ever, and a few hundred of them exhaust MaxConns; a worker that
	// froze mid-upload held the request for ever too. It never cuts an
	// idle stream: an SSE stream with no events is not stalled. nginx's
	// client_body_timeout, send_timeout and proxy_send_timeout do the
	// same, 60 s each. Default 60s; negative turns it off.
	StallTimeout time.Duration
}

func (o *UpstreamOptions) withDefaults() UpstreamOptions {
	d := *o
	if d.MaxConns <= 0 {
		d.MaxConns = 1024
	}
	if d.ConnWait <= 0 {
		d.ConnWait = 2 * time.Second
	}
	if d.DialTimeout <= 0 {
		d.DialTimeout = 2 * time.Second
	}
	if d.IdleTimeout <= 0 {
		d.IdleTimeout = 2 * time.Second
	}
	if d.ResponseHeaderTimeout <= 0 {
		d.ResponseHeaderTimeout = 5 * time.Minute
	}
	if d.BufferSize <= 0 {
		d.BufferSize = 16 << 10
	}
	if d.StallTimeout == 0 {
		d.StallTimeout = 60 * time.Second
	} else if d.StallTimeout < 0 {
		d.StallTimeout = 0
	}
	return d
}

// upstream is one worker advertise URL: its connection pool and the path
// prefix requests are forwarded under.
type upstream struct {
	url    string
	addr   string // host:port to dial
	host   string // Host header for requests without one
	prefix []byte // advertise URL path without its trailing slash
	tls    bool
	pool   *connPool
	dial   func(addr string) (net.Conn, error)

	lastUsed atomic.Int64 // unix seconds
}

// upstreams maps advertise URLs to pools. Pools outlive sessions: a worker
// that re-registers under the same URL keeps its warm connections.
type upstreams struct {
	opts    UpstreamOptions
	metrics Metrics // counts connections opened; nil counts nothing
	mu      sync.RWMutex
	m       map[string]*upstream
}

func newUpstreams(o UpstreamOptions) *upstreams {
	return &upstreams{opts: o.withDefaults(), m: make(map[string]*upstream)}
}

func (us *upstreams) get(advertiseURL string) (*upstream, error) {
	us.mu.RLock()
	u := us.m[advertiseURL]
	us.mu.RUnlock()
	if u != nil {
		return u, nil
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	if u = us.m[advertiseURL]; u != nil {
		return u, nil
	}
	u, err := us.build(advertiseURL)
	if err != nil {
		return nil, err
	}
	us.m[advertiseURL] = u
	return u, nil
}

func (us *upstreams) build(advertiseURL string) (*upstream, error) {
	pu, err := url.Parse(advertiseURL)
	if err != nil {
		return nil, fmt.Errorf("cannot parse advertiseUrl %q: %w", advertiseURL, err)
	}
	u := &upstream{url: advertiseURL, host: pu.Host, prefix: []byte(strings.TrimSuffix(pu.EscapedPath(), "/"))}
	switch pu.Scheme {
	case "http":
		u.addr = hostPort(pu, "80")
	case "https":
		u.addr = hostPort(pu, "443")
		u.tls = true
	default:
		return nil, fmt.Errorf("cannot use advertiseUrl %q: scheme must be http or https", advertiseURL)
	}
	o := us.opts
	dialer := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 15 * time.Second}
	var tlsConfig *tls.Config
	if u.tls {
		tlsConfig = &tls.Config{ServerName: pu.Hostname(), MinVersion: tls.VersionTLS12}
	}
	u.dial = func(addr string) (net.Conn, error) {
		c, err := dialer.Dial("tcp", addr)
		if err != nil {
			return c, err
		}
		// A worker that stops reading, or whose host vanishes, while
		// pinboard sends it small writes (WebSocket messages, a slow
		// upload) is cut by the kernel after the stall timeout: such
		// writes fit in the send buffer, and no write deadline sees them.
		rawio.SetUserTimeout(c, o.StallTimeout)
		if tlsConfig == nil {
			us.connected()
			return c, nil
		}
		// The handshake is part of connecting and has the dial's bound:
		// without a deadline, a worker whose kernel accepts (a stopped
		// process's backlog) but which never answers held the request,
		// and its pool slot, for as long as it stayed silent.
		_ = c.SetDeadline(time.Now().Add(o.DialTimeout))
		tc := tls.Client(c, tlsConfig)
		if err := tc.Handshake(); err != nil {
			_ = c.Close()
			return nil, err
		}
		_ = c.SetDeadline(time.Time{})
		us.connected()
		return tc, nil
	}
	u.pool = newConnPool(u.addr, u.dial, o)
	return u, nil
}

// connected counts a connection opened to a worker.
func (us *upstreams) connected() {
	if us.metrics != nil {
		us.metrics.UpstreamConnect()
	}
}

func hostPort(u *url.URL, def string) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), def)
}

// sweep closes idle connections past the idle timeout and drops pools
// that saw no request for idle, so departed workers do not pin memory.
func (us *upstreams) sweep(now time.Time, idle time.Duration) {
	us.mu.Lock()
	defer us.mu.Unlock()
	for k, u := range us.m {
		u.pool.closeIdle(now, false)
		if now.Unix()-u.lastUsed.Load() > int64(idle/time.Second) && u.pool.open() == 0 {
			u.pool.closeIdle(now, true)
			delete(us.m, k)
		}
	}
}

// closeAll closes every idle connection (shutdown).
func (us *upstreams) closeAll(now time.Time) {
	us.mu.Lock()
	defer us.mu.Unlock()
	for _, u := range us.m {
		u.pool.closeIdle(now, true)
	}
}

// touch records use once per second at most: a shared cache line written
// on every request would cost more than the pool it protects.
func (u *upstream) touch(now time.Time) {
	if s := now.Unix(); u.lastUsed.Load() != s {
		u.lastUsed.Store(s)
	}
}
