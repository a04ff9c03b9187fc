package registry

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// registerBody is POST /registry/register as pinned.pinboard.registration
// (RegistrationClient._register) sends it.
type registerBody struct {
	ClientID       *string             `json:"clientId"`
	Secret         *string             `json:"secret"`
	Namespaces     *[]string           `json:"namespaces"`
	AdvertiseURL   *string             `json:"advertiseUrl"`
	Headroom       *float64            `json:"headroom"`
	Draining       *bool               `json:"draining"`
	Challenge      *string             `json:"challenge"`
	ChallengeValue *string             `json:"challengeValue"`
	Hostname       *string             `json:"hostname"`
	Env            *string             `json:"env"`
	Envs           map[string]string   `json:"envs"`
	Takeover       *string             `json:"takeover"`
	Epoch          *float64            `json:"epoch"`
	PrevSessionID  *string             `json:"prevSessionId"`
	Instances      map[string][]string `json:"instances"`
}

// namespaceRE is the reference host's namespace rule (pinned.hosting.host:
// "'/' plus a single path segment"), less NUL: the stores separate names
// with it (directory.Registration).
var namespaceRE = regexp.MustCompile(`^/[^/\s\x00]+$`)

// ReservedNamespace is the namespace the registry API's paths take
// (route spells them out): a node sends ReservedNamespace + "/…" to
// ServeHTTP, and no worker may register it. The one source of it for the
// server's routing.
const ReservedNamespace = "/registry"

var bodyReservedNamespace = errorBody("namespace " + ReservedNamespace + " is reserved: pinboard serves its registry API there")

const (
	maxTokenLen   = 512
	maxNamespaces = 1024
	// maxInstanceIDs bounds the ids one registration lists. The stores
	// reclaim them directory.RegisterBatch at a time, so it bounds the
	// registration's total time, not how long it holds the store.
	maxInstanceIDs = 100_000
)

// validate returns the registration or nil when the body does not match
// the schema.
func (b *registerBody) validate() *directory.Registration {
	if b.ClientID == nil || b.Secret == nil || b.Namespaces == nil || b.AdvertiseURL == nil ||
		b.Headroom == nil || b.Draining == nil || b.Challenge == nil || b.ChallengeValue == nil {
		return nil
	}
	if !token(*b.ClientID) || !token(*b.Secret) || !token(*b.Challenge) || !token(*b.ChallengeValue) {
		return nil
	}
	headroom := *b.Headroom
	if len(*b.Namespaces) == 0 || len(*b.Namespaces) > maxNamespaces {
		return nil
	}
	seen := make(map[string]bool, len(*b.Namespaces))
	for _, ns := range *b.Namespaces {
		if !namespaceRE.MatchString(ns) || seen[ns] {
			return nil
		}
		seen[ns] = true
	}
	reg := &directory.Registration{
		ClientID:     *b.ClientID,
		Secret:       *b.Secret,
		Namespaces:   *b.Namespaces,
		AdvertiseURL: *b.AdvertiseURL,
		Headroom:     headroom,
		Draining:     *b.Draining,
		Envs:         b.Envs,
		Instances:    b.Instances,
	}
	if b.Hostname != nil {
		// "app.example." is app.example to DNS, and requests arrive with
		// the dot stripped (proxy.hostOnly): kept, it would bind a name no
		// request carries (R-LS-4).
		reg.Hostname = trimFQDNDot(*b.Hostname)
	}
	if b.Env != nil {
		reg.Env = *b.Env
	}
	// NUL separates names in the stores' keys and records.
	if strings.IndexByte(reg.ClientID, 0) >= 0 || strings.IndexByte(reg.Hostname, 0) >= 0 || strings.IndexByte(reg.Env, 0) >= 0 {
		return nil
	}
	for _, e := range b.Envs {
		if strings.IndexByte(e, 0) >= 0 {
			return nil
		}
	}
	if b.Takeover != nil {
		if *b.Takeover != "wind_down" && *b.Takeover != "deny" {
			return nil
		}
		reg.Takeover = *b.Takeover
	}
	if b.Epoch != nil {
		e := *b.Epoch
		// Any integer the worker may send (PinnedWorker takes any int ≥ 0;
		// a nanosecond timestamp is common). Above 2^53 it is a double's
		// value, as JSON.parse gives the reference: epochs compare as
		// the reference compares them.
		if e < 0 || e != math.Trunc(e) || e >= 1<<63 {
			return nil
		}
		reg.Epoch = int64(e)
	}
	if b.PrevSessionID != nil {
		reg.PrevSessionID = *b.PrevSessionID
	}
	n := 0
	for ns, ids := range b.Instances {
		if !namespaceRE.MatchString(ns) {
			return nil
		}
		for _, id := range ids {
			if directory.CheckID(id) != nil {
				return nil
			}
		}
		n += len(ids)
	}
	if n > maxInstanceIDs {
		return nil
	}
	return reg
}

// token reports whether s is a clientId, secret, challenge or challengeValue
// of 1 to maxTokenLen bytes: the worker sends hex digits, where bytes and
// characters agree.
func token(s string) bool { return len(s) > 0 && len(s) <= maxTokenLen }

// registerAck is the register response (pinned.pinboard.registration reads
// sessionId, expiresInMs, duplicates, draining, drainDeadline).
type registerAck struct {
	SessionID     string           `json:"sessionId"`
	ExpiresInMs   int64            `json:"expiresInMs"`
	Draining      bool             `json:"draining"`
	DrainDeadline *float64         `json:"drainDeadline,omitempty"`
	Duplicates    []directory.NSID `json:"duplicates,omitempty"`
}

// register handles POST /registry/register (R-REG-1): it checks the
// request, then hands the challenge probe to ServeHTTP (probeCall);
// admit goes on with its result.
func (r *Registry) register(ctx *fasthttp.RequestCtx) *probeCall {
	pr := r.principal(ctx, attest.ScopeWorker)
	if pr == nil {
		return nil
	}
	var body registerBody
	if !r.readJSON(ctx, &body, bodyRegisterShape) {
		return nil
	}
	reg := body.validate()
	if reg == nil {
		reply(ctx, fasthttp.StatusBadRequest, bodyRegisterShape)
		return nil
	}
	if slices.Contains(reg.Namespaces, ReservedNamespace) {
		// /registry/{id}/… is the registry API: such a namespace would
		// register and then never receive a request.
		reply(ctx, fasthttp.StatusBadRequest, bodyReservedNamespace)
		return nil
	}
	reg.Sub = pr.Sub
	if msg := coverage(pr, reg.Namespaces, reg.Hostname, reg.Env, reg.Envs); msg != "" {
		reply(ctx, fasthttp.StatusForbidden, errorBody("forbidden: "+msg))
		return nil
	}
	// R-TR-3: no registering a worker at an arbitrary internal host.
	if err := pr.Claims.CheckBackend(reg.AdvertiseURL); err != nil {
		reply(ctx, fasthttp.StatusForbidden, errorBody("forbidden: "+err.Error()))
		return nil
	}
	return &probeCall{
		offPool: r.unreachable.has(reg.AdvertiseURL, r.now()),
		url:     reg.AdvertiseURL, secret: reg.Secret, challenge: *body.Challenge, value: *body.ChallengeValue,
		then: func(ctx *fasthttp.RequestCtx, res ProbeResult, err error) { r.admit(ctx, reg, res, err) },
	}
}

// admit answers a probed registration: refused or deferred by the probe,
// else stored and acked.
func (r *Registry) admit(ctx *fasthttp.RequestCtx, reg *directory.Registration, res ProbeResult, err error) {
	r.unreachable.set(reg.AdvertiseURL, res == ProbeUnreachable, r.now())
	switch res {
	case ProbeOK:
	case ProbeUnreachable:
		// Deferral, not rejection: the worker registers from its lifespan,
		// before uvicorn listens, so the first probe can race the bind.
		r.log.Info("register deferred: advertise URL unreachable", "clientId", reg.ClientID, "advertiseUrl", reg.AdvertiseURL, "err", err)
		replyRetry(ctx, errorBody("challenge probe failed: advertise URL unreachable"), 1)
		return
	case ProbeRejected:
		r.log.Warn("register refused: challenge probe rejected", "clientId", reg.ClientID, "advertiseUrl", reg.AdvertiseURL, "err", err)
		reply(ctx, fasthttp.StatusConflict, errorBody("challenge probe failed: "+err.Error()))
		return
	case ProbeMismatch:
		r.log.Warn("register refused: challenge value mismatch", "clientId", reg.ClientID, "advertiseUrl", reg.AdvertiseURL)
		reply(ctx, fasthttp.StatusConflict, errorBody("challenge value mismatch on the advertise URL"))
		return
	}
	c, cancel := r.opContext()
	defer cancel()
	now := r.now()
	out, err := r.store.Register(c, reg, now)
	if err != nil {
		var se *directory.SupersededError
		if errors.As(err, &se) {
			// A stale or denied registration: the binding belongs to a
			// higher epoch (R-LS-4). The worker keeps retrying with backoff.
			r.log.Warn("register refused: superseded", "clientId", reg.ClientID, "hostname", reg.Hostname, "epoch", directory.FormatEpoch(reg.Epoch), "err", se.Error())
			reply(ctx, fasthttp.StatusConflict, supersededBody(se))
			return
		}
		r.storeFailed(ctx, "register", err)
		return
	}
	ack := registerAck{
		SessionID:   out.SessionID,
		ExpiresInMs: ms(out.LeaseUntil.Sub(now)),
		Draining:    reg.Draining || out.Drain.Draining,
		Duplicates:  out.Duplicates,
	}
	if out.Drain.Draining && !out.Drain.Deadline.IsZero() {
		d := seconds(out.Drain.Deadline.Sub(now))
		ack.DrainDeadline = &d
	}
	for _, v := range out.Voided {
		// R-LS-3 at register: the probe was answered at this URL with the
		// new secret, so the session there before is unreachable — a
		// worker restarted in place, or two processes behind one URL.
		r.log.Warn("voided: advertise URL registered by another process", "clientId", v.ClientID, "sessionId", v.SessionID,
			"advertiseUrl", reg.AdvertiseURL, "byClientId", reg.ClientID, "bySessionId", out.SessionID)
	}
	event := "register"
	if reg.PrevSessionID != "" {
		event = "re-register"
	}
	r.log.Info(event, "clientId", reg.ClientID, "sessionId", out.SessionID, "advertiseUrl", reg.AdvertiseURL,
		"namespaces", reg.Namespaces, "prevSessionId", reg.PrevSessionID, "duplicates", len(out.Duplicates))
	replyJSON(ctx, fasthttp.StatusOK, ack)
}

// unreachableFor is how long an advertise URL a register's probe found
// unreachable is remembered: past the worker's longest register backoff
// (30 s, pinned.pinboard._backoff.REGISTER_BACKOFF_MAX).
const unreachableFor = time.Minute

// maxUnreachable and maxUnreachableURL bound the advertise URLs
// remembered, and how long one may be (the body allows a MiB); a
// register's probe to any other waits on the pool, as every first attempt
// does.
const (
	maxUnreachable    = 10_000
	maxUnreachableURL = 2048
)

// unreachableURLs remembers the advertise URLs whose last register probe
// found them unreachable: the next register's probe to one waits off the
// pool (probeCall), as a degraded session's heartbeat does. A worker whose
// URL does not answer (a firewall that drops pinboard's packets, a wrong
// ADVERTISE_URL) retries register for as long as it runs, each probe
// waiting the whole probe timeout; held on the pool, a fleet of them
// would keep healthy workers' heartbeats queued until their leases lapse
// (TestUnreachableRegisterProbesWaitOffPool_RREG1_RLS1). The zero value is
// empty; it is safe for concurrent use.
type unreachableURLs struct {
	mu sync.Mutex
	m  map[string]time.Time // advertise URL → when it is forgotten
}

// has reports whether url's last register probe found it unreachable.
func (u *unreachableURLs) has(url string, now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	until, ok := u.m[url]
	return ok && now.Before(until)
}

// set records the outcome of a register's probe of url.
func (u *unreachableURLs) set(url string, unreachable bool, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !unreachable {
		delete(u.m, url)
		return
	}
	if len(url) > maxUnreachableURL {
		return
	}
	if u.m == nil {
		u.m = make(map[string]time.Time)
	}
	if _, ok := u.m[url]; !ok && len(u.m) >= maxUnreachable {
		maps.DeleteFunc(u.m, func(_ string, until time.Time) bool { return !now.Before(until) })
		if len(u.m) >= maxUnreachable {
			return
		}
	}
	u.m[url] = now.Add(unreachableFor)
}

// coverage returns why the principal's claims do not cover a registration
// (R-TR-3), or "".
func coverage(pr *attest.Principal, namespaces []string, hostname, env string, envs map[string]string) string {
	for _, ns := range namespaces {
		if !pr.Claims.CoversNamespace(ns) {
			return fmt.Sprintf("namespace %s is not covered by the credential's claims", ns)
		}
	}
	if hostname != "" && !pr.Claims.CoversHostname(hostname) {
		return fmt.Sprintf("hostname %s is not covered by the credential's claims", hostname)
	}
	if env != "" && !pr.Claims.CoversEnv(env) {
		return fmt.Sprintf("env %s is not covered by the credential's claims", env)
	}
	// Per-namespace envs bind too (directory.EnvOf): each must be covered,
	// or a key limited to one env could take another's bindings.
	for _, ns := range slices.Sorted(maps.Keys(envs)) {
		if e := envs[ns]; e != "" && !pr.Claims.CoversEnv(e) {
			return fmt.Sprintf("env %s (for %s) is not covered by the credential's claims", e, ns)
		}
	}
	// A hostname binds each namespace to its env, and no env is one too
	// (directory.EnvOf gives ""): a key limited to some envs that left env
	// out would join, as a replica, the binding of a fleet registered
	// without an env, which its envs claim does not cover. Without a
	// hostname nothing is bound, and no env is needed.
	if hostname != "" {
		for _, ns := range namespaces {
			if directory.EnvOf(env, envs, ns) == "" && !pr.Claims.CoversEnv("") {
				return fmt.Sprintf("an empty env (for %s) is not covered by the credential's claims", ns)
			}
		}
	}
	return ""
}

// trimFQDNDot drops the trailing dot of a fully qualified name, keeping a
// lone "." (no name to shorten).
func trimFQDNDot(name string) string {
	if len(name) > 1 && name[len(name)-1] == '.' {
		return name[:len(name)-1]
	}
	return name
}
