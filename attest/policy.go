package attest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// Decision is what a namespace policy says about one data-plane request
// (R-TR-4). The zero value is Unauthorized, so a forgotten assignment fails
// closed.
type Decision uint8

const (
	// Unauthorized: the namespace needs a credential and none was
	// presented; the proxy answers 401.
	Unauthorized Decision = iota
	// Forbidden: a credential was presented but does not reach the
	// namespace (claims or scopes), or the namespace is denied; 403.
	Forbidden
	// Allow: forward the request.
	Allow
)

// String returns "unauthorized", "forbidden" or "allow".
func (d Decision) String() string {
	switch d {
	case Unauthorized:
		return "unauthorized"
	case Forbidden:
		return "forbidden"
	case Allow:
		return "allow"
	}
	return "Decision(" + strconv.Itoa(int(d)) + ")"
}

// allowKind is a policy's "allow" value.
type allowKind uint8

const (
	allowAuthenticated allowKind = iota // also the rule when no policy matches
	allowAnonymous
	allowDeny
)

// policy is one entry of the passport's "namespaces" object.
type policy struct {
	pattern string // without leading slash; "*" for the catch-all
	allow   allowKind
	scopes  []string // required scopes, authenticated only
}

// policySet finds the policy for a namespace: an exact key wins, then the
// longest matching glob (ties: the lexically smaller pattern, so the choice
// never depends on map order), then "*". No policy at all means the
// namespace needs an authenticated principal whose claims cover it (the
// guide: "Production policies: authenticate").
type policySet struct {
	exact map[string]*policy
	globs []*policy // longest first
	star  *policy
}

// parsePolicies compiles the top-level "namespaces" object. Policy forms:
//
//	{"allow":"anonymous"}                       anyone, credential optional
//	{"allow":"authenticated"}                   a principal whose claims cover the namespace
//	{"allow":"authenticated","scopes":["x"]}    … that also holds every listed scope
//	{"allow":"deny"} or {"allow":"none"}        nobody
func parsePolicies(raw json.RawMessage, warn func(string)) (policySet, error) {
	obj, err := decodeObject(raw)
	if err != nil {
		return policySet{}, fmt.Errorf("cannot parse namespaces: %w", err)
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	ps := policySet{exact: make(map[string]*policy)}
	seen := make(map[string]string, len(keys)) // normalized → key as written
	for _, key := range keys {
		path := joinPath("namespaces", key)
		pattern, err := normalizeNamespacePattern(key)
		if err != nil {
			return policySet{}, fmt.Errorf("cannot parse %s: %w", path, err)
		}
		if prev, dup := seen[pattern]; dup {
			return policySet{}, fmt.Errorf("cannot parse %s: same namespace pattern as %s", path, joinPath("namespaces", prev))
		}
		seen[pattern] = key
		pol, err := parsePolicy(obj[key], path, warn)
		if err != nil {
			return policySet{}, fmt.Errorf("cannot parse %s: %w", path, err)
		}
		pol.pattern = pattern
		switch {
		case pattern == "*":
			ps.star = pol
		case globHasStar(pattern):
			ps.globs = append(ps.globs, pol)
		default:
			ps.exact[pattern] = pol
		}
	}
	slices.SortFunc(ps.globs, func(a, b *policy) int {
		if c := cmp.Compare(len(b.pattern), len(a.pattern)); c != 0 {
			return c
		}
		return cmp.Compare(a.pattern, b.pattern)
	})
	return ps, nil
}

func parsePolicy(raw json.RawMessage, path string, warn func(string)) (*policy, error) {
	obj, err := decodeObject(raw)
	if err != nil {
		return nil, err
	}
	warnUnknown(obj, path, warn, "allow", "scopes")
	allow, err := requiredString(obj, "allow")
	if err != nil {
		return nil, err
	}
	pol := &policy{}
	switch allow {
	case "anonymous":
		pol.allow = allowAnonymous
	case "authenticated":
		pol.allow = allowAuthenticated
	case "deny", "none":
		pol.allow = allowDeny
	default:
		return nil, fmt.Errorf(`allow: unknown policy %q (want "anonymous", "authenticated" or "deny")`, allow)
	}
	if raw, ok := obj["scopes"]; ok {
		scopes, err := parseScopes(raw)
		if err != nil {
			return nil, err
		}
		if pol.allow != allowAuthenticated {
			warn(path + `.scopes: only "authenticated" policies require scopes; ignored`)
		} else {
			pol.scopes = scopes
		}
	}
	return pol, nil
}

func globHasStar(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '*' {
			return true
		}
	}
	return false
}

// lookup returns the policy for ns (without leading slash), or nil.
func (ps *policySet) lookup(ns []byte) *policy {
	// The compiler turns a map index by string(bytes) into a lookup that
	// does not allocate.
	if pol, ok := ps.exact[string(ns)]; ok {
		return pol
	}
	for _, pol := range ps.globs {
		if globMatch(pol.pattern, ns, false) {
			return pol
		}
	}
	return ps.star
}

// Admit decides whether a data-plane request for namespace ns ("/counters"
// or "counters") may proceed (R-TR-4). pr is the result of Authenticate
// (nil for anonymous). For "anonymous" policies everyone is admitted, and a
// principal, if any, still travels on in the attestation. For
// "authenticated" policies, and for namespaces no policy matches, pr must be
// present, its claims must cover ns and it must hold every scope the policy
// lists. "deny" forbids everyone. Admit allocates nothing.
func (p *Passport) Admit(ns []byte, pr *Principal) Decision {
	ns = trimNamespace(ns)
	pol := p.policies.lookup(ns)
	allow := allowAuthenticated
	if pol != nil {
		allow = pol.allow
	}
	switch allow {
	case allowAnonymous:
		return Allow
	case allowDeny:
		return Forbidden
	}
	if pr == nil {
		return Unauthorized
	}
	if !coversNamespace(&pr.Claims, ns) {
		return Forbidden
	}
	if pol != nil {
		for _, s := range pol.scopes {
			if !pr.HasScope(s) {
				return Forbidden
			}
		}
	}
	return Allow
}

// AdmitCall decides whether an attested cluster call (R-TR-6) from a
// session that account sub registered may reach namespace ns ("/counters"
// or "counters"). The call carries no credential of its own, so the
// registering account's claims bound it as they bound that account's own
// requests (R-TR-3): a key covering only /a must not reach /b through its
// worker's session secret. A namespace that admits anonymous clients
// admits every call; any other (deny included: an internal namespace
// reached only by its fleet's calls) needs the account, still in the
// passport, to cover it, and to hold the scopes the namespace's policy
// asks of clients: before, a key without them, refused at /admin itself,
// reached it through its worker's calls. A refusal says which of the two
// failed, so that the operator knows whether the key's namespaces claim or
// its scopes need the change. AdmitCall allocates nothing.
func (p *Passport) AdmitCall(ns []byte, sub string) CallVerdict {
	ns = trimNamespace(ns)
	pol := p.policies.lookup(ns)
	if pol != nil && pol.allow == allowAnonymous {
		return CallVerdict{OK: true}
	}
	pr := p.bySub[sub]
	if pr == nil || !coversNamespace(&pr.Claims, ns) {
		return CallVerdict{}
	}
	if pol != nil {
		for _, s := range pol.scopes {
			if !pr.HasScope(s) {
				return CallVerdict{MissingScope: s}
			}
		}
	}
	return CallVerdict{OK: true}
}

// CallVerdict is AdmitCall's answer. A refusal with MissingScope empty is
// a namespace the registering key does not cover (or a key no longer in
// the passport); with it set, the key covers the namespace but lacks that
// scope, the first of the policy's it does not hold.
type CallVerdict struct {
	OK           bool
	MissingScope string
}
