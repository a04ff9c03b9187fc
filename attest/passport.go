package attest

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// Passport is the parsed PINBOARD_PASSPORT: the credentials pinboard accepts
// (R-TR-1), what each may do (R-TR-2, R-TR-3) and who may reach which
// namespace (R-TR-4). It is immutable after ParsePassport and safe for
// concurrent use.
type Passport struct {
	principals []*Principal
	byDigest   map[[sha256.Size]byte]*credential
	bySub      map[string]*Principal
	policies   policySet
	warnings   []string
}

// credential is a principal's secret; kept apart from Principal so that
// handing a *Principal to request handlers never hands out the token.
type credential struct {
	token     []byte
	principal *Principal
}

// ParsePassport parses the JSON of PINBOARD_PASSPORT, for example
//
//	{"providers":[{"type":"staticToken","id":"pinboard","keys":[{
//	  "name":"deployment","token":{"env":"PINBOARD_TOKEN"},
//	  "scopes":["pinboard:worker","pinboard:operator"],
//	  "claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}]}],
//	 "namespaces":{"*":{"allow":"anonymous"}}}
//
// Key tokens are never written into the passport: each key names the
// environment variable holding it, read through lookupEnv (nil means
// os.LookupEnv). Start-up must fail on any error (R-SRV-2); errors name the
// offending part of the passport by path, e.g.
//
//	cannot parse providers[0].keys[0] "deployment": token.env names PINBOARD_TOKEN, which is not set
//
// Unknown fields are tolerated for compatibility with passports written for
// the Node pinboard and listed by Warnings; so are members written twice in
// one object, of which the last is used, as JSON.parse does.
func ParsePassport(raw []byte, lookupEnv func(string) (string, bool)) (*Passport, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	if !utf8.Valid(raw) {
		return nil, errors.New("cannot parse passport: not valid UTF-8")
	}
	if err := checkSyntax(raw); err != nil {
		return nil, fmt.Errorf("cannot parse passport JSON %w", err)
	}
	top, err := decodeObject(raw)
	if err != nil {
		return nil, fmt.Errorf("cannot parse passport: %w", err)
	}
	pp := &passportParser{
		lookupEnv: lookupEnv,
		p:         &Passport{byDigest: make(map[[sha256.Size]byte]*credential), bySub: make(map[string]*Principal)},
		keyPaths:  make(map[[sha256.Size]byte]string),
		subPaths:  make(map[string]string),
	}
	warnDuplicateMembers(raw, pp.warn)
	warnUnknown(top, "", pp.warn, "providers", "namespaces")
	providers, ok := top["providers"]
	if !ok {
		return nil, errors.New("cannot parse passport: providers is required")
	}
	if err := pp.parseProviders(providers); err != nil {
		return nil, err
	}
	if len(pp.p.principals) == 0 {
		return nil, errors.New("cannot parse providers: the passport holds no key; at least one is required")
	}
	if raw, ok := top["namespaces"]; ok {
		if pp.p.policies, err = parsePolicies(raw, pp.warn); err != nil {
			return nil, err
		}
	}
	return pp.p, nil
}

// Warnings lists what ParsePassport tolerated but an operator should fix,
// such as unknown fields, by path. Callers log them at start-up and must not
// modify the slice.
func (p *Passport) Warnings() []string {
	return p.warnings
}

// Principals lists every key of the passport in passport order, for
// start-up logs and operator views. The slice and the principals are shared:
// do not modify them.
func (p *Passport) Principals() []*Principal {
	return p.principals
}

// passportParser carries what parsing the providers accumulates.
type passportParser struct {
	lookupEnv func(string) (string, bool)
	p         *Passport
	keyPaths  map[[sha256.Size]byte]string // token digest → key that holds it
	subPaths  map[string]string            // account id → key that holds it
}

func (pp *passportParser) warn(w string) {
	pp.p.warnings = append(pp.p.warnings, w)
}

func (pp *passportParser) parseProviders(raw json.RawMessage) error {
	providers, err := decodeArray(raw)
	if err != nil {
		return fmt.Errorf("cannot parse providers: %w", err)
	}
	ids := make(map[string]int, len(providers))
	for i, raw := range providers {
		path := fmt.Sprintf("providers[%d]", i)
		obj, err := decodeObject(raw)
		if err != nil {
			return fmt.Errorf("cannot parse %s: %w", path, err)
		}
		warnUnknown(obj, path, pp.warn, "type", "id", "keys")
		typ, err := requiredString(obj, "type")
		if err != nil {
			return fmt.Errorf("cannot parse %s: %w", path, err)
		}
		// Signed JWTs with JWKS are welcome later (R-TR-1); until then an
		// unknown type must stop start-up rather than admit nobody.
		if typ != "staticToken" {
			return fmt.Errorf("cannot parse %s: unsupported provider type %q (want \"staticToken\")", path, typ)
		}
		id, err := requiredString(obj, "id")
		if err != nil {
			return fmt.Errorf("cannot parse %s: %w", path, err)
		}
		if prev, dup := ids[id]; dup {
			return fmt.Errorf("cannot parse %s: id %q is already used by providers[%d]", path, id, prev)
		}
		ids[id] = i
		keysRaw, ok := obj["keys"]
		if !ok {
			return fmt.Errorf("cannot parse %s %q: keys is required", path, id)
		}
		keys, err := decodeArray(keysRaw)
		if err != nil {
			return fmt.Errorf("cannot parse %s %q: keys: %w", path, id, err)
		}
		names := make(map[string]int, len(keys))
		for j, raw := range keys {
			if err := pp.parseKey(raw, id, fmt.Sprintf("%s.keys[%d]", path, j), j, names); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseKey compiles one staticToken key into a principal and its credential.
func (pp *passportParser) parseKey(raw json.RawMessage, provider, path string, index int, names map[string]int) error {
	obj, err := decodeObject(raw)
	if err != nil {
		return fmt.Errorf("cannot parse %s: %w", path, err)
	}
	warnUnknown(obj, path, pp.warn, "name", "token", "scopes", "claims")
	name, err := requiredString(obj, "name")
	if err != nil {
		return fmt.Errorf("cannot parse %s: %w", path, err)
	}
	if prev, dup := names[name]; dup {
		return fmt.Errorf("cannot parse %s: name %q is already used by keys[%d] of this provider", path, name, prev)
	}
	names[name] = index
	named := fmt.Sprintf("%s %q", path, name) // "providers[0].keys[0] "deployment""

	token, err := pp.parseToken(obj, path)
	if err != nil {
		return fmt.Errorf("cannot parse %s: %w", named, err)
	}
	var scopes []string
	if raw, ok := obj["scopes"]; ok {
		if scopes, err = parseScopes(raw); err != nil {
			return fmt.Errorf("cannot parse %s: %w", named, err)
		}
		warnScopes(scopes, path+".scopes", pp.warn)
	}
	pr := &Principal{Sub: provider + ":" + name, Provider: provider, Name: name, Scopes: scopes}
	// The registry tells accounts apart by sub alone (whose session a
	// heartbeat, release or deregister may touch) and workers read it as
	// acct.sub: provider "a:b" key "c" and provider "a" key "b:c" must not
	// both be "a:b:c".
	if prev, dup := pp.subPaths[pr.Sub]; dup {
		return fmt.Errorf("cannot parse %s: its account id %q (provider:name) is also the account id of %s; rename one", named, pr.Sub, prev)
	}
	pp.subPaths[pr.Sub] = named
	var claimsRaw json.RawMessage
	if raw, ok := obj["claims"]; ok {
		claimsObj, err := decodeObject(raw)
		if err != nil {
			return fmt.Errorf("cannot parse %s: claims: %w", named, err)
		}
		claimsRaw = raw
		if pbRaw, ok := claimsObj["pinboard"]; ok {
			pbObj, err := decodeObject(pbRaw)
			if err != nil {
				return fmt.Errorf("cannot parse %s: claims.pinboard: %w", named, err)
			}
			if pr.Claims, err = parseClaims(pbObj, path+".claims.pinboard", pp.warn); err != nil {
				return fmt.Errorf("cannot parse %s: claims.pinboard.%w", named, err)
			}
		}
	}
	if pr.AcctJSON, err = appendAcctJSON(nil, pr.Sub, pr.Scopes, claimsRaw); err != nil {
		return fmt.Errorf("cannot parse %s: %w", named, err)
	}
	// The acct rides in every attestation of this key's requests, and the
	// worker reads the payload with json.loads: nesting past the recursion
	// limit raises (an integer past 4300 digits would fail too; numbers
	// are written as JavaScript writes doubles, so none gets that long).
	// Checked as it sits in a payload (one level down).
	if _, err := pyLoads(append(append([]byte(`{"acct":`), pr.AcctJSON...), '}')); err != nil {
		return fmt.Errorf("cannot parse %s: claims: %w, which the worker's JSON parser refuses (every attestation of this key would fail)", named, err)
	}

	digest := sha256.Sum256(token)
	if prev, dup := pp.keyPaths[digest]; dup {
		return fmt.Errorf("cannot parse %s: its token is also the token of %s; every key needs its own", named, prev)
	}
	pp.keyPaths[digest] = named
	pp.p.byDigest[digest] = &credential{token: token, principal: pr}
	pp.p.principals = append(pp.p.principals, pr)
	pp.p.bySub[pr.Sub] = pr
	return nil
}

// parseToken resolves {"token":{"env":"VAR"}} to the variable's value.
func (pp *passportParser) parseToken(key jsonObject, path string) ([]byte, error) {
	raw, ok := key["token"]
	if !ok {
		return nil, errors.New(`token is required (want {"env":"VAR"})`)
	}
	obj, err := decodeObject(raw)
	if err != nil {
		return nil, fmt.Errorf(`token: %w (want {"env":"VAR"})`, err)
	}
	warnUnknown(obj, path+".token", pp.warn, "env")
	envRaw, ok := obj["env"]
	if !ok {
		return nil, errors.New(`token.env is required (want {"env":"VAR"})`)
	}
	env, err := decodeString(envRaw)
	if err != nil {
		return nil, fmt.Errorf("token.env: %w", err)
	}
	if env == "" {
		return nil, errors.New("token.env is empty; it must name an environment variable")
	}
	value, set := pp.lookupEnv(env)
	switch {
	case !set:
		return nil, fmt.Errorf("token.env names %s, which is not set", env)
	case value == "":
		return nil, fmt.Errorf("token.env names %s, which is empty", env)
	}
	// Authenticate reads "Bearer <token>" with the token free of white
	// space (RFC 6750 §2.1), and a header value carries no control bytes
	// (RFC 9110 §5.5): a token holding either could never be presented.
	// The usual cause is a secret file's trailing newline.
	if i := ascii.IndexSpaceOrCtl(value); i >= 0 {
		return nil, fmt.Errorf("token.env names %s, whose value holds white space or a control byte at offset %d (a trailing newline?); no Authorization header could carry it", env, i)
	}
	return []byte(value), nil
}

// parseScopes decodes "scopes", dropping duplicates and keeping order.
func parseScopes(raw json.RawMessage) ([]string, error) {
	all, err := decodeStrings(raw, "scopes")
	if err != nil {
		return nil, err
	}
	scopes := make([]string, 0, len(all))
	seen := make(map[string]bool, len(all))
	for i, s := range all {
		if s == "" {
			return nil, fmt.Errorf("scopes[%d]: empty scope", i)
		}
		if !seen[s] {
			seen[s] = true
			scopes = append(scopes, s)
		}
	}
	return scopes, nil
}

// warnScopes reports a key's scopes that look meant for pinboard but are
// not one it checks (R-TR-2): "pinboard:workers", "Pinboard:Worker", or a
// scope padded with white space (" pinboard:worker"). They are kept, as
// every scope is (a namespace policy may require any string), and grant
// nothing here: such a key's worker was refused registration with 403
// and nothing at start-up said why.
func warnScopes(scopes []string, path string, warn func(string)) {
	for _, s := range scopes {
		t := strings.TrimSpace(s)
		if s == ScopeWorker || s == ScopeOperator || !(t != s || len(t) >= len("pinboard:") && strings.EqualFold(t[:len("pinboard:")], "pinboard:")) {
			continue
		}
		warn(fmt.Sprintf("%s: %q is not a scope pinboard checks (%s, %s); kept for namespace policies, it grants nothing else", path, s, ScopeWorker, ScopeOperator))
	}
}

// requiredString decodes obj[name], which must be a non-empty string.
func requiredString(obj jsonObject, name string) (string, error) {
	raw, ok := obj[name]
	if !ok {
		return "", fmt.Errorf("%s is required", name)
	}
	s, err := decodeString(raw)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if s == "" {
		return "", fmt.Errorf("%s must not be empty", name)
	}
	return s, nil
}
