package directory

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// RedisOptions configure OpenRedis. Only LeaseTTL is required.
type RedisOptions struct {
	// LeaseTTL is PINBOARD_LEASE_TTL_MS (R-LS-1). Every node sharing a
	// directory must use the same value.
	LeaseTTL time.Duration
	// Prefix names the directory: every key is "{Prefix}:…", one hash tag,
	// so one slot on Redis Cluster (docs/DIRECTORY.md). Default "pinboard";
	// no braces.
	Prefix string
	// Staleness is how long a node may keep serving from its cache after
	// its connection silently stopped delivering invalidations. It sets the
	// connection-liveness options (idle PING gap, write and dial timeouts).
	// Default LeaseTTL/4 within [1s, 3s]: well under one lease, and not so
	// tight that a CPU-starved node (notes: invalidations stretched to
	// 16 ms p90 on 2 busy cores) drops healthy connections.
	Staleness time.Duration
	// TLSConfig replaces the TLS settings a rediss:// URL implies: the
	// masters', and the sentinels' of a rediss+sentinel:// URL.
	TLSConfig *tls.Config
	// CacheBytes is rueidis's client-side cache per connection; default
	// 64 MiB. The node-local decoded cache is bounded by
	// MaxCachedPlacements instead.
	CacheBytes int
	// MaxCachedPlacements bounds the node-local placement cache; default
	// 1<<20 (about 150 MiB at worst). Beyond it arbitrary entries are
	// dropped: a dropped id costs one cached read on its next request.
	MaxCachedPlacements int
	// Now is the clock for background lease refreshes, and the one
	// compared with Redis's (a warning when they differ by more than half
	// the staleness budget); nil uses time.Now. Store methods use the times
	// their callers pass.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
	// Observer sees every round trip (for metrics); nil records none.
	Observer CommandObserver
}

// Redis is the directory on Redis, Redis Cluster or Sentinel: any number of
// stateless pinboard nodes on one URL share it and agree on one owner per
// id (R-SRV-1, R-PL-1). Every ownership decision is one Lua script; reads of
// hot placements come from a node-local cache kept exact by RESP3 client
// tracking, so a steady-state request costs no Redis round trip.
// docs/DIRECTORY.md describes keys, scripts and the invalidation design.
//
// Redis is safe for concurrent use. Close stops its background loops.
type Redis struct {
	c       rueidis.Client
	ttl     time.Duration
	prefix  string // "{tag}:"
	budget  time.Duration
	now     func() time.Time
	log     *slog.Logger
	obs     CommandObserver
	maxRows int // per shard

	shards [redisShards]redisShard
	// longKeys builds Lookup keys past lookupKeyLen.
	longKeys keyPool

	smu      sync.RWMutex
	sessions map[string]*redisSession
	// views: the decoded member sets and headroom new placements rank
	// (redis_view.go).
	views placeViews
	// beats: the sessions heartbeating through this node (KnownSessions).
	beats beatSessions
	// leaseGen counts lease invalidations; a session read that saw it move
	// marks the session dirty (its lease may be older than the push).
	leaseGen atomic.Uint64

	// connGen counts replacements of the tracking connection (and wipes);
	// a fill must start and end in one generation.
	connGen atomic.Uint64
	// untracked: a nil invalidation came since the last revalidation.
	// Besides a closed connection, it is Redis flushing its whole
	// tracking table (FLUSHDB or FLUSHALL of any database) while the
	// connection lives on: the rows cached before it are no longer
	// tracked, even when the era and the connection are unchanged.
	untracked atomic.Bool
	// cluster: the client runs in Redis Cluster mode, where a nil
	// invalidation is mostly a connection to another master closing, and
	// a flush of another database cannot happen (a cluster has only
	// database 0; a flush of it takes the era key, which revalidation
	// finds): untracked is not set there, or every such close would drop
	// the cached rows.
	cluster atomic.Bool
	// demoted: a write was refused with READONLY, the connection reaches
	// a replica (noteReadOnly); the revalidator closes it, at most once
	// per revalidateEvery (lastQuit, Unix nanoseconds).
	demoted  atomic.Bool
	lastQuit atomic.Int64
	// down: Redis is not answering (gatedClient); calls that need it
	// fail at once until a revalidation attempt hears it again.
	down   atomic.Bool
	eraMu  sync.Mutex
	era    string // wipe detector: the value of the era key we last saw
	connID string // identity of the connection tracking the directory
	// seenEpoch is the highest placement epoch this node has read in the
	// current era: a reconnect to a directory whose epoch counter is
	// below it finds lost placements (redis_regress.lua).
	seenEpoch atomic.Uint64
	// skew is the node's clock less Redis's (nanoseconds) at the last
	// check; skewed: past half the budget then (noteClock).
	skew   atomic.Int64
	skewed atomic.Bool

	reval chan struct{} // wakes the revalidator after a flush or disconnect
	stats redisStats

	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	// afterBatch, when set (tests only, before use), runs between the
	// batches of a registration's instances.
	afterBatch func()
	// afterDrop, when set (tests only, before use), runs between the
	// script calls that free a dropped session's rows.
	afterDrop func()
	// afterSessionRead, when set (tests only, before use), runs in resolve
	// between reading unknown sessions and adopting them.
	afterSessionRead func()
	// afterViewRead, when set (tests only, before use), runs in Place
	// between the reads of its view (redis_view.go) and their store, with
	// what was read: "members" or "entries".
	afterViewRead func(what string)
	// afterClaim, when set (tests only, before use), runs in Place between
	// the claim script's reply, naming the owner's session, and the read
	// of that session.
	afterClaim func(sid string)
}

var (
	_ Store          = (*Redis)(nil)
	_ ExpiredCounter = (*Redis)(nil)
)

// Cache lifetimes handed to DoCache. Entries live until invalidated; the
// TTL only bounds memory for keys nobody writes any more.
const (
	cacheTTL      = time.Hour
	sweepBatch    = 256  // sessions dropped per Sweep call
	maxSweepCalls = 4096 // script calls per Sweep: 1M rows; the next goes on
	trackLimit    = 4096 // rows a registration tracks for the local cache
	queueLeases   = 2    // control queues expire two leases after use (R-CM-1)
	defaultPrefix = "pinboard"
)

// OpenRedis connects to the Redis that url names (see ParseRedisURL for the
// forms) and returns the directory. Errors wrapping ErrInvalidURL are
// configuration errors; others mean Redis could not be reached.
func OpenRedis(ctx context.Context, url string, opts RedisOptions) (*Redis, error) {
	if opts.LeaseTTL <= 0 {
		return nil, errors.New("cannot open the redis directory: RedisOptions.LeaseTTL is required")
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		// "{}x}:" is an empty hash tag, which Redis Cluster ignores: the
		// keys would spread over slots and every script fail CROSSSLOT.
		return nil, fmt.Errorf("cannot open the redis directory: RedisOptions.Prefix %q holds a brace, which would break the keys' hash tag", opts.Prefix)
	}
	copt, err := redisClientOptions(url, opts)
	if err != nil {
		return nil, err
	}
	r := newRedis(opts)
	r.configure(&copt, opts)
	c, err := rueidis.NewClient(copt)
	if err != nil {
		if refusedByRedis(err) {
			return nil, fmt.Errorf("cannot connect to redis at %s: %w: %v", redactURL(url), ErrRefused, err)
		}
		return nil, fmt.Errorf("cannot connect to redis at %s: %w: %w", redactURL(url), ErrUnavailable, err)
	}
	r.c = gatedClient{Client: c, r: r}
	r.cluster.Store(c.Mode() == rueidis.ClientModeCluster)
	if err := r.openEra(ctx); err != nil {
		c.Close()
		if refusedByRedis(err) {
			// %v, not %w: the error wraps ErrUnavailable, which a refusal is not.
			return nil, fmt.Errorf("cannot open the redis directory at %s: %w: %v", redactURL(url), ErrRefused, err)
		}
		return nil, fmt.Errorf("cannot open the redis directory at %s: %w", redactURL(url), err)
	}
	if err := r.probeScripts(ctx, url); err != nil {
		c.Close()
		return nil, err
	}
	r.checkEviction(ctx)
	bg, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.revalidateLoop(bg) }()
	go func() { defer r.wg.Done(); r.refreshLoop(bg) }()
	return r, nil
}

// probeScripts runs one of the directory's read-only scripts (EVALSHA_RO,
// then EVAL_RO on NOSCRIPT) on the node serving its slot. Every heartbeat
// of a session the node does not know yet, the workers listing and the
// placement lookup run one: a server without them (before Redis 7.0, or a
// compatible server that lacks them) or an ACL denying them opened fine and
// then failed each of those with 503 — every worker's first heartbeat
// through each node, so the fleet's leases lapsed while health said ready.
// Such a server is refused here, a configuration error; so is one that
// refuses a script's undeclared keys (scripts declare one key and reach the
// others, all in its slot, by name: docs/DIRECTORY.md "One hash tag").

// LeaseTTL is the lease every registration and heartbeat gets (R-LS-1).
func (r *Redis) LeaseTTL() time.Duration { return r.ttl }

func (r *Redis) probeScripts(ctx context.Context, url string) error {
	// The session script for session "" (no session id is empty): it
	// reads the undeclared lease and tomb keys by name, as every script
	// reaches all but its declared key, and answers "unknown".
	err := r.run(ctx, "open.probe", scriptSession, r.key("s", ""), []string{r.prefix, micros(r.now()), ""}).Error()
	if err == nil {
		return nil
	}
	if refusedByRedis(err) {
		return fmt.Errorf("cannot run the directory's read-only scripts (EVALSHA_RO, EVAL_RO: Redis 7.0 or later, and an ACL allowing them) on redis at %s: %w: %v",
			redactURL(url), ErrRefused, err)
	}
	return fmt.Errorf("cannot open the redis directory at %s: %w", redactURL(url), unavailable("run", "a read-only script", err))
}

// redisErrCode is the code of the Redis error reply in err's chain, its
// first word ("OOM", "NOPERM", "READONLY"), or "" when there is none.
func redisErrCode(err error) string {
	if err == nil {
		return ""
	}
	var re *rueidis.RedisError
	if !errors.As(err, &re) || re.IsNil() {
		return ""
	}
	code, _, _ := strings.Cut(re.Error(), " ")
	return code
}

// refusedByRedis reports whether err, from opening the directory, is an
// answer of Redis's that no retry mends (ErrRefused): authentication
// (WRONGPASS, NOAUTH, a password the server has none for), an ACL denying
// a command the directory needs (NOPERM), a database index out of range,
// a command the server does not have (an older Redis), a server refusing
// a script's undeclared keys, or a server without RESP3 and client
// tracking (rueidis.ErrNoCache; an ACL denying CLIENT TRACKING comes as
// that too). Everything else — a connection refused or timed out,
// LOADING, MASTERDOWN, CLUSTERDOWN, the server's client limit — may pass,
// and stays ErrUnavailable.
func refusedByRedis(err error) bool {
	if errors.Is(err, rueidis.ErrNoCache) {
		return true
	}
	var re *rueidis.RedisError
	if !errors.As(err, &re) || re.IsNil() {
		return false
	}
	msg := re.Error()
	switch redisErrCode(re) {
	case "WRONGPASS", "NOAUTH", "NOPERM":
		return true
	}
	for _, s := range [...]string{"DB index is out of range", "invalid DB index", "invalid password", "without any password configured"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	// A command the server does not have (CLIENT INFO before Redis 6.2,
	// EVALSHA_RO before 7.0, or renamed away): no retry mends it.
	// A server refusing a script's undeclared keys neither.
	lower := strings.ToLower(msg)
	return strings.Contains(lower, "unknown command") || strings.Contains(lower, "unknown subcommand") ||
		strings.Contains(lower, "undeclared key")
}

// redisClientOptions parses url (ParseRedisURL) and applies opts.TLSConfig
// to every connection the URL makes over TLS: the masters, and the
// sentinels of a rediss+sentinel:// URL, which would otherwise still
// verify against the system roots a private CA in TLSConfig replaces.
func redisClientOptions(url string, opts RedisOptions) (rueidis.ClientOption, error) {
	copt, err := ParseRedisURL(url)
	if err != nil {
		return copt, err
	}
	if opts.TLSConfig != nil {
		copt.TLSConfig = opts.TLSConfig
		if copt.Sentinel.TLSConfig != nil {
			copt.Sentinel.TLSConfig = opts.TLSConfig.Clone()
		}
	}
	return copt, nil
}

func newRedis(opts RedisOptions) *Redis {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = defaultPrefix
	}
	r := &Redis{
		ttl:      opts.LeaseTTL,
		prefix:   "{" + prefix + "}:",
		budget:   opts.Staleness,
		now:      opts.Now,
		log:      opts.Logger,
		obs:      opts.Observer,
		sessions: make(map[string]*redisSession),
		reval:    make(chan struct{}, 1),
	}
	if r.budget <= 0 {
		r.budget = min(max(opts.LeaseTTL/4, time.Second), 3*time.Second)
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.obs == nil {
		r.obs = NopCommandObserver{}
	}
	limit := opts.MaxCachedPlacements
	if limit <= 0 {
		limit = 1 << 20
	}
	r.maxRows = max(limit/redisShards, 16)
	r.views.init()
	for i := range r.shards {
		r.shards[i].rows = make(map[string]redisRow)
		r.shards[i].watch = make(map[string]*redisWatch)
	}
	return r
}

// configure sets the client options the directory depends on.
//
// Liveness: a silent partition stops invalidations without an error, and
// is only noticed when an idle PING goes unanswered. rueidis pings after
// Dialer.KeepAlive of silence and gives up after ConnWriteTimeout, so a
// dead connection is dropped within about KeepAlive + ConnWriteTimeout =
// 1.25 × the staleness budget; the drop flushes the cache (OnInvalidations(nil))
// and starts revalidation (redis_sessions.go).
//
// One connection per master (PipelineMultiplex -1): every command and
// every invalidation push of the directory's slot then travel one ordered
// stream, which is what lets a write's own invalidations be accounted for
// exactly (execTracked).
func (r *Redis) configure(o *rueidis.ClientOption, opts RedisOptions) {
	o.OnInvalidations = r.onInvalidations
	o.PipelineMultiplex = -1
	o.CacheSizeEachConn = opts.CacheBytes
	if o.CacheSizeEachConn <= 0 {
		o.CacheSizeEachConn = 64 << 20
	}
	o.Dialer.KeepAlive = r.budget / 4
	o.ConnWriteTimeout = r.budget
	if o.Dialer.Timeout <= 0 {
		o.Dialer.Timeout = r.budget
	}
	// Fail fast: a read retries twice (a reconnect after a killed
	// connection), then the caller gets ErrUnavailable and answers 503
	// with Retry-After instead of holding the request for its whole
	// timeout while Redis is down (R-DP-4).
	o.RetryDelay = func(attempts int, _ rueidis.Completed, _ error) time.Duration {
		if attempts >= 2 {
			return -1
		}
		return time.Duration(attempts+1) * 5 * time.Millisecond
	}
	o.ClusterOption.ShardsRefreshInterval = 10 * time.Second
	if o.Sentinel.MasterSet != "" {
		o.Sentinel.TopologyRefreshInterval = 5 * time.Second
		o.Sentinel.Dialer = o.Dialer
	}
	// Never NOLOOP: a node's own writes must invalidate its own cache.
	o.ClientTrackingOptions = nil
}

// Name implements Store.
func (r *Redis) Name() string { return "redis" }

// Close stops the background loops and closes the connections.
func (r *Redis) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	if r.cancel != nil {
		r.cancel()
	}
	r.wg.Wait()
	if r.c != nil {
		r.c.Close()
	}
	return nil
}

// Keys. Row names are "ns\x00id": NUL cannot occur in a namespace or an id.
func (r *Redis) rowKey(ns, id string) string { return r.prefix + "p:" + ns + "\x00" + id }
func rowName(ns, id string) string           { return ns + "\x00" + id }
func (r *Redis) key(kind, name string) string {
	return r.prefix + kind + ":" + name
}

// unavailable wraps a transport or server failure: callers map it to 503
// with Retry-After (R-DP-4).
func unavailable(op, what string, err error) error {
	return fmt.Errorf("cannot %s %q: %w: %w", op, what, ErrUnavailable, err)
}

// micros formats t as integer microseconds, the directory's time unit
// (exact in Lua's doubles; see redis_lib.lua), rounded up: a lease the
// scripts set at now plus the TTL then runs the whole TTL from the
// caller's now, as the memory store's does, not a part of a microsecond
// less — which the registry, answering expiresInMs in whole milliseconds
// of a nanosecond clock, wrote as 14999 for 15 s (R-LS-1). Deadlines round
// up the same way, never coming back earlier than set.
func micros(t time.Time) string {
	return strconv.FormatInt(t.Add(time.Microsecond-1).UnixMicro(), 10)
}

// leaseMicros is the lease TTL in microseconds.
func (r *Redis) leaseMicros() string { return strconv.FormatInt(r.ttl.Microseconds(), 10) }

// fromMicros parses a time written by micros; 0 and garbage give zero time.
func fromMicros(s string) time.Time {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n == 0 {
		return time.Time{}
	}
	return time.UnixMicro(n)
}

// redisStats are the store's counters (atomic; read with Stats).
type redisStats struct {
	fills, invalidations, flushes, wipes, reconnects, refreshes, refreshPasses, claims atomic.Uint64
}

// RedisStats is a snapshot of a Redis store's counters. Invalidations,
// Flushes, Wipes and Reconnects are counted once the node has acted on
// them: a caller that sees a count grow finds the rows it covers dropped.
type RedisStats struct {
	// Fills: placements inserted into the node-local cache.
	Fills uint64
	// Invalidations: placement keys invalidated by Redis pushes.
	Invalidations uint64
	// Flushes: whole-cache invalidations (FLUSHALL, disconnects).
	Flushes uint64
	// Wipes: flushes after which the directory was found empty.
	Wipes uint64
	// Reconnects: flushes after which the directory was intact.
	Reconnects uint64
	// Refreshes: session leases re-read after an invalidation.
	Refreshes uint64
	// RefreshPasses: refresher passes that re-read at least one lease,
	// counted once the pass has applied every lease it read.
	RefreshPasses uint64
	// Claims: claim scripts run.
	Claims uint64
	// CachedPlacements and Sessions are the current local cache sizes.
	CachedPlacements, Sessions int
	// ClockSkew is how far the node's clock (RedisOptions.Now) was ahead
	// of Redis's at the last connection check (negative: behind).
	ClockSkew time.Duration
}

// Stats returns the store's counters.
func (r *Redis) Stats() RedisStats {
	s := RedisStats{
		Fills:         r.stats.fills.Load(),
		Invalidations: r.stats.invalidations.Load(),
		Flushes:       r.stats.flushes.Load(),
		Wipes:         r.stats.wipes.Load(),
		Reconnects:    r.stats.reconnects.Load(),
		Refreshes:     r.stats.refreshes.Load(),
		RefreshPasses: r.stats.refreshPasses.Load(),
		Claims:        r.stats.claims.Load(),
		ClockSkew:     time.Duration(r.skew.Load()),
	}
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.RLock()
		s.CachedPlacements += len(sh.rows)
		sh.mu.RUnlock()
	}
	r.smu.RLock()
	s.Sessions = len(r.sessions)
	r.smu.RUnlock()
	return s
}

// checkEviction warns when the Redis serving the directory's slot may evict
// keys. The directory keeps its state in keys only scripts remove, so an
// eviction is a silent loss: under allkeys-* an evicted placement row is
// placed again while its owner still hosts the instance (two owners,
// R-PL-1) and an evicted lease ends a live worker; under volatile-* the
// control queues (the only keys with a TTL but the tombs) go before they
// are acked (R-CM-1). Managed offerings often default to such a policy.
// Only a warning: INFO may be denied by ACLs, and memory may never fill.
func (r *Redis) checkEviction(ctx context.Context) {
	// The keyed read pins INFO to the node serving the directory's slot.
	res := r.c.DoMulti(ctx, r.c.B().Get().Key(r.prefix+"era").Build(), r.c.B().Info().Section("memory").Build())
	info, err := res[1].ToString()
	if err != nil {
		r.log.Debug("directory cannot read the redis eviction policy", "err", err)
		return
	}
	for _, line := range strings.Split(strings.TrimPrefix(info, "txt:"), "\n") {
		policy, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:")
		if !ok || policy == "noeviction" {
			continue
		}
		r.log.Warn("redis may evict directory keys (maxmemory-policy "+policy+"): placements, leases or control messages "+
			"can vanish under memory pressure, and an evicted placement is placed twice; set maxmemory-policy noeviction",
			"maxmemory_policy", policy)
	}
}

// noteClock records how far the node's clock is from Redis's, read with
// TIME (res) in a round trip the node's clock put between before and
// after. Lease expiries are written with the clock of the node that took a
// registration or heartbeat and compared with the clock of every node that
// reads them (claims, lookups, sweeps): a node whose clock is off takes
// live workers for dead — its claims move their ids, its sweep drops their
// sessions — or dead ones for live, and nothing else would say so. Past
// half the staleness budget it warns, once until the clocks agree again.
// A round trip longer than that measures nothing.
func (r *Redis) noteClock(before, after time.Time, res rueidis.RedisResult) {
	limit := r.budget / 2
	t, err := res.AsStrSlice()
	if err != nil || len(t) != 2 || after.Sub(before) > limit {
		return
	}
	sec, err1 := strconv.ParseInt(t[0], 10, 64)
	usec, err2 := strconv.ParseInt(t[1], 10, 64)
	if err1 != nil || err2 != nil {
		return
	}
	skew := before.Add(after.Sub(before) / 2).Sub(time.Unix(sec, usec*1000))
	r.skew.Store(int64(skew))
	off := skew.Abs() > limit
	if r.skewed.Swap(off) == off {
		return
	}
	if off {
		r.log.Warn("this node's clock differs from redis's: lease expiries are written and compared with each node's own clock, "+
			"so a node whose clock is off takes live workers for dead (moving their ids, dropping their sessions) or dead ones for live; "+
			"keep every node's clock in sync (NTP)", "skew", skew, "limit", limit)
	} else {
		r.log.Info("this node's clock agrees with redis's again", "skew", skew)
	}
}
