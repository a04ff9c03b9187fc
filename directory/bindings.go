package directory

import "github.com/pinboard-go/pinboard/internal/ascii"

// Hostname-aware bindings (R-LS-4). A worker registering with a hostname
// binds {hostname}{ns} — for each of its namespaces — to its env at its
// registration epoch (pinned's PinnedWorker(hostname=, env=, epoch=,
// takeover=), PinnedHost(env=) for per-namespace envs). A registration at a
// higher epoch takes the binding; the sessions holding it at a lower epoch
// (or for another env) are superseded: their records are dropped and their
// next heartbeat gets 409 superseded, upon which the worker aborts its
// instances and stops registering for good.
//
// Rules for a registration (env e, epoch n) against the current binding:
//   - no binding, or no live session holds it: take it;
//   - n above the binding's epoch: take it, supersede its holders;
//   - same epoch and env: join it (replicas of one deployment);
//   - same epoch, another env: take it and supersede when takeover is
//     "wind_down"; refuse otherwise;
//   - n below the binding's epoch: refuse (the worker is stale).
//
// The documents leave takeover's finer semantics to the Node pinboard;
// these rules are ours (docs/PROTOCOL.md).

// EnvOf is the env a registration binds ns to: its per-namespace override,
// else its worker env.
func EnvOf(env string, envs map[string]string, ns string) string {
	if e, ok := envs[ns]; ok {
		return e
	}
	return env
}

// BindingState is the current holder of a {hostname}{ns} binding.
type BindingState struct {
	// Env is the env the binding binds the namespace to.
	Env string
	// Epoch is the registration epoch the binding was taken at.
	Epoch int64
	// Live is true while a live session holds the binding.
	Live bool
}

// BindingVerdict is what a registration does to one binding.
type BindingVerdict uint8

const (
	// BindTake: the registration holds the binding (new or joined).
	BindTake BindingVerdict = iota
	// BindSupersede: the registration takes the binding and displaces the
	// sessions holding it.
	BindSupersede
	// BindRefuse: the registration is stale or denied.
	BindRefuse
)

// DecideBinding applies the rules above.
func DecideBinding(cur BindingState, env string, epoch int64, takeover string) BindingVerdict {
	switch {
	case !cur.Live:
		return BindTake
	case epoch > cur.Epoch:
		return BindSupersede
	case epoch == cur.Epoch && env == cur.Env:
		return BindTake
	case epoch == cur.Epoch && takeover == "wind_down":
		return BindSupersede
	default:
		return BindRefuse
	}
}

// sameHost compares hostnames by ASCII case only (package ascii says why:
// the Redis store's scripts lower-case with Lua's string.lower).
func sameHost(a, b string) bool { return a != "" && ascii.EqualFold(a, b) }

// holdsBinding reports whether a session with this hostname, epoch and
// envs holds the {hostname}{ns} binding at (env, epoch).
func holdsBinding(info *SessionInfo, hostname, ns, env string, epoch int64) bool {
	if !sameHost(info.Hostname, hostname) || info.Epoch != epoch {
		return false
	}
	serves := false
	for _, n := range info.Namespaces {
		serves = serves || n == ns
	}
	return serves && EnvOf(info.Env, info.Envs, ns) == env
}

func bindingKey(hostname, ns string) string {
	return ascii.Lower(hostname) + "\x00" + ns
}

// appendBindingKey appends bindingKey(hostname, ns) to dst: a map lookup
// by string(appendBindingKey(…)) allocates nothing.
func appendBindingKey(dst []byte, hostname, ns string) []byte {
	return append(append(ascii.AppendLower(dst, hostname), 0), ns...)
}
