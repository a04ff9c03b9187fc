package directory

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/rueidis"
)

// The directory's Lua scripts. Each is redis_lib.lua followed by its body,
// so the helpers (eligibility, row moves, session drops) are written once;
// the register scripts share redis_register_lib.lua too.
// Every script declares one key and reaches the others through the prefix
// in ARGV[1]: all keys share one hash tag, hence one slot, so this is safe
// on Redis Cluster (docs/DIRECTORY.md, "Cluster").
var (
	//go:embed redis_lib.lua
	luaLib string
	//go:embed redis_claim.lua
	luaClaim string
	//go:embed redis_register_lib.lua
	luaRegisterLib string
	//go:embed redis_register.lua
	luaRegister string
	//go:embed redis_register_batch.lua
	luaRegisterBatch string
	//go:embed redis_register_done.lua
	luaRegisterDone string
	//go:embed redis_heartbeat.lua
	luaHeartbeat string
	//go:embed redis_release_batch.lua
	luaReleaseBatch string
	//go:embed redis_drop.lua
	luaDrop string
	//go:embed redis_drain.lua
	luaDrain string
	//go:embed redis_winddown.lua
	luaWindDown string
	//go:embed redis_sweep.lua
	luaSweep string
	//go:embed redis_session.lua
	luaSession string
	//go:embed redis_workers.lua
	luaWorkers string
	//go:embed redis_placement.lua
	luaPlacement string
	//go:embed redis_regress.lua
	luaRegress string
)

// Scripts, held in package variables as rueidis recommends: immutable after
// init, shared by every store.
var (
	scriptClaim         = newScript(luaClaim, false)
	scriptRegister      = newScript(luaRegisterLib+"\n"+luaRegister, false)
	scriptRegisterBatch = newScript(luaRegisterLib+"\n"+luaRegisterBatch, false)
	scriptRegisterDone  = newScript(luaRegisterLib+"\n"+luaRegisterDone, false)
	scriptHeartbeat     = newScript(luaHeartbeat, false)
	scriptReleaseBatch  = newScript(luaReleaseBatch, false)
	scriptDrop          = newScript(luaDrop, false)
	scriptDrain         = newScript(luaDrain, false)
	scriptWindDown      = newScript(luaWindDown, false)
	scriptSweep         = newScript(luaSweep, false)
	scriptSession       = newScript(luaSession, true)
	scriptWorkers       = newScript(luaWorkers, true)
	scriptPlacement     = newScript(luaPlacement, true)
	scriptRegress       = newScript(luaRegress, false)
)

// script is a Lua script with the SHA-1 the tracked variants need:
// rueidis.Lua runs EVALSHA then EVAL on NOSCRIPT, but a claim must run
// inside one pipelined round trip with the tracking read after it
// (execTracked), which Lua.Exec cannot express.
type script struct {
	lua *rueidis.Lua
	src string
	sha string
	ro  bool
}

func newScript(body string, readOnly bool) *script {
	src := luaLib + "\n" + body
	sum := sha1.Sum([]byte(src))
	s := &script{src: src, sha: hex.EncodeToString(sum[:]), ro: readOnly}
	if readOnly {
		s.lua = rueidis.NewLuaScriptReadOnly(src)
	} else {
		s.lua = rueidis.NewLuaScript(src)
	}
	return s
}

// run executes a script (EVALSHA, then EVAL after NOSCRIPT) and reports
// the round trip to the observer as op.
func (r *Redis) run(ctx context.Context, op string, sc *script, key string, args []string) rueidis.RedisResult {
	start := time.Now()
	res := sc.lua.Exec(ctx, r.c, []string{key}, args)
	r.observe(op, start, res.Error())
	return res
}

// runWrite is run for scripts that delete or rewrite placement rows
// (release, drop, sweep). A keyed no-op read rides behind the script in
// the same pipeline: Redis sends the invalidation pushes the script's
// writes cause for this node before that reply, and rueidis handles them
// before the call returns, so a read through the client cache right after
// cannot return the row as it was (../shared/notes/REDIS.md: never re-read
// through the cache after a write without that ordering).
func (r *Redis) runWrite(ctx context.Context, op string, sc *script, key string, args []string) rueidis.RedisResult {
	res, at := r.pipeScript(ctx, op, sc, key, args, func(eval rueidis.Completed) (rueidis.Commands, int) {
		return rueidis.Commands{eval, r.c.B().Exists().Key(key).Build()}, 0
	})
	return res[at]
}

// pipeScript runs sc in one pipelined round trip, among the commands
// around builds around its EVALSHA (around returns the pipeline and the
// script's index in it), and reports the round trip as op. On NOSCRIPT (a
// restarted or failed-over Redis lost its script cache, or this script
// never ran there) the round trip is built and sent again with EVAL: the
// failed attempt wrote nothing, and is reported without an error.
// Commands are built afresh per attempt: rueidis recycles sent ones.
func (r *Redis) pipeScript(ctx context.Context, op string, sc *script, key string, args []string,
	around func(eval rueidis.Completed) (rueidis.Commands, int)) ([]rueidis.RedisResult, int) {
	for attempt := 0; ; attempt++ {
		eval := sc.evalsha(r.c, key, args)
		if attempt > 0 {
			eval = sc.eval(r.c, key, args)
		}
		cmds, at := around(eval)
		start := time.Now()
		res := r.c.DoMulti(ctx, cmds...)
		if err := res[at].Error(); err != nil && attempt == 0 && isNoScript(err) {
			// NOSCRIPT is EVALSHA asking for the source, not a failing
			// store: the round trip counts, its error does not (as
			// rueidis.Lua.Exec's retry inside run is not seen at all).
			r.observe(op, start, nil)
			continue
		}
		r.observeMulti(op, start, res)
		return res, at
	}
}

// observe reports one round trip; a nil reply is a domain outcome, not an
// error (CommandObserver).
func (r *Redis) observe(op string, start time.Time, err error) {
	if rueidis.IsRedisNil(err) {
		err = nil
	}
	r.obs.StoreCommand(op, roundTrip(start, err), err)
}

// roundTrip is the duration to report for a call started at start that
// ended with err: 0 when the gate refused it and nothing went to Redis
// (CommandObserver).
func roundTrip(start time.Time, err error) time.Duration {
	if errors.Is(err, errNotAnswering) {
		return 0
	}
	return time.Since(start)
}

// observeCached reports a DoCache read as observe does, unless the
// client-side cache answered it: no round trip, and the cache's answers
// would swamp Redis's latency.
func (r *Redis) observeCached(op string, start time.Time, res rueidis.RedisResult) {
	if !res.IsCacheHit() {
		r.observe(op, start, res.Error())
	}
}

// observeMulti reports a pipelined round trip with its first failure;
// nothing when the client-side cache answered every command (DoMultiCache
// then sent none).
func (r *Redis) observeMulti(op string, start time.Time, res []rueidis.RedisResult) {
	hits := 0
	for i := range res {
		if res[i].IsCacheHit() {
			hits++
		}
	}
	if len(res) > 0 && hits == len(res) {
		return
	}
	var err error
	for i := range res {
		if e := res[i].Error(); e != nil && !rueidis.IsRedisNil(e) {
			err = e
			break
		}
	}
	r.obs.StoreCommand(op, roundTrip(start, err), err)
}

// evalsha builds the EVALSHA command; eval the EVAL fallback.
func (s *script) evalsha(c rueidis.Client, key string, args []string) rueidis.Completed {
	return c.B().Evalsha().Sha1(s.sha).Numkeys(1).Key(key).Arg(args...).Build()
}

func (s *script) eval(c rueidis.Client, key string, args []string) rueidis.Completed {
	return c.B().Eval().Script(s.src).Numkeys(1).Key(key).Arg(args...).Build()
}

func isNoScript(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && re.IsNoScript()
}
