package directory

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/redis/rueidis"
)

// errNotAnswering is what a call that needs Redis gets while the node
// holds Redis for not answering (gatedClient). Callers wrap it as every
// transport error, with ErrUnavailable: 503 and Retry-After (R-DP-4).
var errNotAnswering = errors.New("redis is not answering (a connection timed out); waiting for it to answer again")

// gatedClient is the directory's rueidis client, failing calls at once
// while Redis is known not to answer.
//
// A Redis that stops answering without closing anything — paused
// (SIGSTOP, a VM or container freeze), stalled, or cut off by a silent
// partition — holds every call until its caller's deadline: the
// connection is found dead only by its unanswered keep-alive PING (about
// 1.25 staleness budgets), and every new connection's handshake then
// waits a budget too, since the kernel still completes the TCP handshake
// for the stopped process; reads try three times. Measured: a new
// placement 5–6 s (the proxy's whole placeTimeout), a heartbeat 3 s,
// readiness 3 s past its own 2 s, for as long as Redis stayed paused,
// where a stopped Redis (connections refused) failed them in
// milliseconds. So once a call's connection timed out (the keep-alive
// PING unanswered, a dial or handshake past its budget; a caller's own
// deadline does not count) or a revalidation got no answer within the
// budget, the node is down: calls fail here until the revalidator, which
// keeps trying on its own (ungated, each try bounded by the budget),
// hears Redis answer again. Lookup never comes here: cached ids keep
// routing under their owners' known leases.
//
// Safe for concurrent use. The check is one atomic load per call.
type gatedClient struct {
	rueidis.Client
	r *Redis
}

var _ rueidis.Client = gatedClient{}

// ungated marks the revalidator's context: its calls go to Redis while
// the node is down, and are how it learns Redis answers again.
type ungated struct{}

func (g gatedClient) shut(ctx context.Context) bool {
	return g.r.down.Load() && ctx.Value(ungated{}) == nil
}

// Do implements rueidis.Client.
func (g gatedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if g.shut(ctx) {
		return rueidis.NewErrorResult(errNotAnswering)
	}
	res := g.Client.Do(ctx, cmd)
	g.r.noteAnswer(ctx, res.NonRedisError())
	g.r.noteReadOnly(res.Error())
	return res
}

// DoMulti implements rueidis.Client.
func (g gatedClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if g.shut(ctx) {
		return notAnswering(len(cmds))
	}
	res := g.Client.DoMulti(ctx, cmds...)
	g.r.noteAnswers(ctx, res)
	for i := range res {
		g.r.noteReadOnly(res[i].Error())
	}
	return res
}

// DoCache implements rueidis.Client. Refused too while down: the node's
// connection, and rueidis's cache of it, are gone by then.
func (g gatedClient) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	if g.shut(ctx) {
		return rueidis.NewErrorResult(errNotAnswering)
	}
	res := g.Client.DoCache(ctx, cmd, ttl)
	g.r.noteAnswer(ctx, res.NonRedisError())
	return res
}

// DoMultiCache implements rueidis.Client.
func (g gatedClient) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	if g.shut(ctx) {
		return notAnswering(len(multi))
	}
	res := g.Client.DoMultiCache(ctx, multi...)
	g.r.noteAnswers(ctx, res)
	return res
}

func notAnswering(n int) []rueidis.RedisResult {
	res := make([]rueidis.RedisResult, n)
	for i := range res {
		res[i] = rueidis.NewErrorResult(errNotAnswering)
	}
	return res
}

// noteAnswer takes the node down when err, a call's transport error
// (nil: Redis answered, perhaps with an error reply), says Redis did not
// answer in time (timedOut) and the caller's context is not done: a slow
// call past a caller's deadline says nothing about Redis. A connection
// closed or refused does not either: the next call reconnects at once (a
// killed connection, a restart), and a stopped Redis fails calls at once
// anyway.
func (r *Redis) noteAnswer(ctx context.Context, err error) {
	if timedOut(err) && ctx.Err() == nil {
		r.goDown(err)
	}
}

// noteAnswers is noteAnswer for the first transport error of a
// pipeline's results: in a DoMultiCache, answers from the client cache
// may follow one that timed out.
func (r *Redis) noteAnswers(ctx context.Context, res []rueidis.RedisResult) {
	for i := range res {
		if err := res[i].NonRedisError(); err != nil {
			r.noteAnswer(ctx, err)
			return
		}
	}
}

// noteReadOnly wakes the revalidator when err is a write refused with
// READONLY: the connection reaches a replica. A failover that keeps the
// master's address — a managed primary endpoint whose DNS name now
// resolves to the promoted replica, a Kubernetes Service that follows the
// master — leaves the node's open connection on the old master, demoted:
// Redis keeps it open and refuses every write, so heartbeats,
// registrations and new placements answered 503 for as long as the
// process ran, while readiness said ready. The revalidator closes the
// connection (revalidate), and the next command reconnects through the
// address. Not on a Redis Cluster: a demoted master redirects (MOVED),
// which rueidis follows.
func (r *Redis) noteReadOnly(err error) {
	if r.cluster.Load() || redisErrCode(err) != "READONLY" {
		return
	}
	if !r.demoted.Swap(true) {
		select {
		case r.reval <- struct{}{}:
		default:
		}
	}
}

// timedOut reports whether err is a deadline passing: rueidis's keep-alive
// PING unanswered, a dial or handshake timing out (rueidis bounds those
// with contexts of its own, so they come as context.DeadlineExceeded
// while the caller's context is not done), or a context's.
func timedOut(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// goDown marks Redis as not answering and wakes the revalidator, which
// brings the node back up (up) once Redis answers it.
func (r *Redis) goDown(err error) {
	if r.closed.Load() {
		return
	}
	if !r.down.Swap(true) {
		r.log.Warn("redis is not answering: calls that need it fail at once (503) until it answers again; cached ids keep routing",
			"err", err)
	}
	select {
	case r.reval <- struct{}{}:
	default:
	}
}

// up marks Redis as answering again.
func (r *Redis) up() {
	if r.down.Swap(false) {
		r.log.Info("redis is answering again")
	}
}
