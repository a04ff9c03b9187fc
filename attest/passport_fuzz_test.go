package attest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// FuzzParsePassport_RTR1 checks PINBOARD_PASSPORT parsing (R-SRV-2, R-TR-1):
// a refusal is one line starting "cannot parse" that never repeats a
// token; warnings are one line each; an accepted passport has a key, each
// key's token authenticates it and nobody else, subjects read
// "<provider>:<name>", acct is valid JSON; and parsing is deterministic.
func FuzzParsePassport_RTR1(f *testing.F) {
	withKeys := func(keys ...string) string {
		return `{"providers":[{"type":"staticToken","id":"pinboard","keys":[` + strings.Join(keys, ",") + `]}]}`
	}
	withPolicies := func(p string) string {
		return `{"providers":[{"type":"staticToken","id":"pinboard","keys":[` + deploymentKey + `]}],"namespaces":` + p + `}`
	}
	for _, s := range []string{
		`{"providers":[{"type":"staticToken","id":"pinboard","keys":[` + deploymentKey + `]}],"namespaces":{"*":{"allow":"anonymous"}}}`,
		`{"providers":`, `{}`, `{"providers":{}}`, `{"providers":[]}`, `{"providers":["x"]}`,
		`{"providers":[{"type":"staticToken","id":"a","keys":[]},{"type":"jwks","id":"b","keys":[]}]}`,
		`{"providers":[{"type":"staticToken","id":"a","keys":[]},{"type":"staticToken","id":"a","keys":[]}]}`,
		withKeys(`{"name":"a","token":{"env":"PINBOARD_TOKEN"}}`, `{"name":"a","token":{"env":"CLIENT_TOKEN"}}`),
		withKeys(`{"name":"a","token":{"env":"PINBOARD_TOKEN"}}`, `{"name":"b","token":{"env":"PINBOARD_TOKEN"}}`),
		withKeys(`{"name":"k","token":{"env":"UNSET"}}`), withKeys(`{"name":"k","token":{"env":"EMPTY"}}`),
		withKeys(`{"name":"k","token":{"env":"SPACE"}}`),
		withPolicies(`{"/counters":{"allow":"authenticated","scopes":[1]}}`),
		withPolicies(`{"counters":{"allow":"anonymous"},"/counters":{"allow":"deny"}}`),
		withPolicies(`{"/a/b":{"allow":"anonymous"}}`),
		withPolicies(`{"/count*":{"allow":"authenticated","scopes":["pinboard:worker"]},"/x\u00a0y":{"allow":"deny"}}`),
		`{"version":2,"providers":[{"type":"staticToken","id":"p","issuer":"x","keys":[
		{"name":"k","token":{"env":"PINBOARD_TOKEN","file":"/x"},"scope":["typo"],
		 "claims":{"custom":1,"pinboard":{"namespaces":["*"],"env":["prod"]}}}]}],
		"namespaces":{"/counters":{"allow":"anonymous","scopes":["x"],"why":"dev"}}}`,
		`{"providers":[
		{"type":"staticToken","id":"ops","keys":[{"name":"a","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:operator","custom:x","pinboard:operator"]}]},
		{"type":"staticToken","id":"ci","keys":[{"name":"a","token":{"env":"CLIENT_TOKEN"}}]}]}`,
		withKeys(`{"name":"k","token":{"env":"PINBOARD_TOKEN"},"claims":{"pinboard":{"namespaces":["/counters"],"allowedBackendHosts":["10.0.0.0/8:8000","*.internal"],"hostnames":["*.example.com"],"envs":["prod*"]}}}`),
		withKeys(`{"name":"k","token":{"env":"PINBOARD_TOKEN"},"claims":{"pinboard":{"allowedBackendHosts":["[::1]:x"]}}}`),
		"{\"providers\":[\xff]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		looked := map[string]string{}
		lookup := func(name string) (string, bool) {
			switch name {
			case "UNSET":
				return "", false
			case "EMPTY":
				return "", true
			case "SPACE":
				return " secret- x ", true
			}
			d := sha256.Sum256([]byte(name))
			tok := "secret-" + hex.EncodeToString(d[:8])
			looked[name] = tok
			return tok, true
		}
		p, err := ParsePassport(raw, lookup)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "cannot parse") || strings.ContainsAny(msg, "\r\n") || strings.Contains(msg, "secret-") {
				t.Fatalf("unexpected error for %q; got %q; want one line starting \"cannot parse\" without a token", raw, msg)
			}
			return
		}
		for _, w := range p.Warnings() {
			if w == "" || strings.ContainsAny(w, "\r\n") || strings.Contains(w, "secret-") {
				t.Fatalf("unexpected warning for %q: %q", raw, w)
			}
		}
		prs := p.Principals()
		if len(prs) == 0 {
			t.Fatalf("unexpected passport without keys from %q", raw)
		}
		for _, pr := range prs {
			if pr.Sub != pr.Provider+":"+pr.Name || pr.Provider == "" || pr.Name == "" {
				t.Fatalf("unexpected subject %q (%q, %q) from %q", pr.Sub, pr.Provider, pr.Name, raw)
			}
			if !json.Valid(pr.AcctJSON) {
				t.Fatalf("unexpected acct %q from %q", pr.AcctJSON, raw)
			}
		}
		seen := map[*Principal]bool{}
		for _, tok := range looked {
			pr, err := p.Authenticate([]byte("Bearer " + tok))
			if err != nil || pr == nil || !slices.Contains(prs, pr) || seen[pr] {
				t.Fatalf("unexpected authentication of a token of %q; got %v, %v", raw, pr, err)
			}
			seen[pr] = true
		}
		if len(seen) != len(prs) {
			t.Fatalf("unexpected keys in %q; %d authenticate; want %d", raw, len(seen), len(prs))
		}
		if pr, err := p.Authenticate([]byte("Bearer secret-nope")); pr != nil || err == nil {
			t.Fatalf("unexpected authentication of an unknown token; got %v, %v", pr, err)
		}
		p2, err := ParsePassport(raw, lookup)
		if err != nil || !slices.Equal(p.Warnings(), p2.Warnings()) || len(p2.Principals()) != len(prs) {
			t.Fatalf("unexpected second parse of %q: %v", raw, err)
		}
	})
}
