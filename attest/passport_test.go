package attest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// testEnv is a lookupEnv over a fixed map.
func testEnv(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

var defaultTestEnv = map[string]string{
	"PINBOARD_TOKEN": "tok-deployment",
	"CLIENT_TOKEN":   "tok-client",
	"EMPTY_TOKEN":    "",
}

const deploymentKey = `{"name":"deployment","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}`

// withKeys builds a one-provider passport around the given key objects.
func withKeys(keys ...string) string {
	return `{"providers":[{"type":"staticToken","id":"pinboard","keys":[` + strings.Join(keys, ",") + `]}]}`
}

// withPolicies builds a passport with the deployment key and a namespaces object.
func withPolicies(namespaces string) string {
	return `{"providers":[{"type":"staticToken","id":"pinboard","keys":[` + deploymentKey + `]}],"namespaces":` + namespaces + `}`
}

// keyWith returns the deployment key with one member replaced or added.
func keyWith(member string) string {
	return `{"name":"k","token":{"env":"PINBOARD_TOKEN"},` + member + `}`
}

func TestParsePassport_GuideExample_RTR1(t *testing.T) {
	raw := `{"providers":[{"type":"staticToken","id":"pinboard","keys":[` + deploymentKey + `]}],"namespaces":{"*":{"allow":"anonymous"}}}`
	p, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Fatalf("unexpected warnings; got %q; want none", w)
	}
	prs := p.Principals()
	if len(prs) != 1 {
		t.Fatalf("unexpected principals; got %d; want 1", len(prs))
	}
	pr := prs[0]
	if pr.Sub != "pinboard:deployment" || pr.Provider != "pinboard" || pr.Name != "deployment" {
		t.Fatalf("unexpected identity; got %q %q %q", pr.Sub, pr.Provider, pr.Name)
	}
	if !slices.Equal(pr.Scopes, []string{ScopeWorker, ScopeOperator}) {
		t.Fatalf("unexpected scopes; got %q", pr.Scopes)
	}
	if !pr.Claims.CoversNamespace("/anything") || pr.Claims.CheckBackend("http://10.0.0.1:8000") != nil {
		t.Fatalf("claims with \"*\" must cover everything")
	}
	want := `{"sub":"pinboard:deployment","scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}`
	if string(pr.AcctJSON) != want {
		t.Fatalf("unexpected AcctJSON;\ngot  %s\nwant %s", pr.AcctJSON, want)
	}
}

func TestParsePassport_Errors_RTR1(t *testing.T) {
	// Each case names the part of the passport at fault; every listed
	// substring must appear in the error.
	cases := []struct {
		name string
		raw  string
		want []string
	}{
		{"invalid JSON", `{"providers":`, []string{"cannot parse passport JSON at offset"}},
		{"invalid UTF-8", "{\"providers\":\"\xff\"}", []string{"cannot parse passport: not valid UTF-8"}},
		{"not an object", `[]`, []string{"cannot parse passport: want an object, got array"}},
		{"providers missing", `{}`, []string{"providers is required"}},
		{"providers not array", `{"providers":{}}`, []string{"cannot parse providers: want an array, got object"}},
		{"no keys at all", `{"providers":[]}`, []string{"cannot parse providers:", "at least one"}},
		{"provider keys empty", `{"providers":[{"type":"staticToken","id":"a","keys":[]}]}`, []string{"at least one"}},
		{"provider not object", `{"providers":["x"]}`, []string{"cannot parse providers[0]: want an object, got string"}},
		{"type missing", `{"providers":[{"id":"a","keys":[]}]}`, []string{"providers[0]: type is required"}},
		{"type not string", `{"providers":[{"type":1,"id":"a","keys":[]}]}`, []string{"providers[0]: type: want a string, got number"}},
		{"type unsupported", `{"providers":[{"type":"staticToken","id":"a","keys":[]},{"type":"jwks","id":"b","keys":[]}]}`,
			[]string{"providers[1]", `unsupported provider type "jwks"`, `"staticToken"`}},
		{"id missing", `{"providers":[{"type":"staticToken","keys":[]}]}`, []string{"providers[0]: id is required"}},
		{"id empty", `{"providers":[{"type":"staticToken","id":"","keys":[]}]}`, []string{"providers[0]: id must not be empty"}},
		{"id duplicate", `{"providers":[{"type":"staticToken","id":"a","keys":[]},{"type":"staticToken","id":"a","keys":[]}]}`,
			[]string{"providers[1]", `id "a" is already used by providers[0]`}},
		{"keys missing", `{"providers":[{"type":"staticToken","id":"a"}]}`, []string{`providers[0] "a": keys is required`}},
		{"keys not array", `{"providers":[{"type":"staticToken","id":"a","keys":{}}]}`, []string{`providers[0] "a": keys: want an array, got object`}},
		{"key not object", withKeys(`7`), []string{"providers[0].keys[0]: want an object, got number"}},
		{"key name missing", withKeys(`{"token":{"env":"PINBOARD_TOKEN"}}`), []string{"providers[0].keys[0]: name is required"}},
		{"key name empty", withKeys(`{"name":"","token":{"env":"PINBOARD_TOKEN"}}`), []string{"providers[0].keys[0]: name must not be empty"}},
		{"key name duplicate", withKeys(`{"name":"a","token":{"env":"PINBOARD_TOKEN"}}`, `{"name":"a","token":{"env":"CLIENT_TOKEN"}}`),
			[]string{"providers[0].keys[1]", `name "a" is already used by keys[0]`}},
		{"token missing", withKeys(`{"name":"k"}`), []string{`providers[0].keys[0] "k": token is required`}},
		{"token not object", withKeys(`{"name":"k","token":"secret"}`), []string{`providers[0].keys[0] "k": token: want an object, got string`, `{"env":"VAR"}`}},
		{"token env missing", withKeys(`{"name":"k","token":{}}`), []string{`providers[0].keys[0] "k": token.env is required`}},
		{"token env not string", withKeys(`{"name":"k","token":{"env":["X"]}}`), []string{`"k": token.env: want a string, got array`}},
		{"token env empty name", withKeys(`{"name":"k","token":{"env":""}}`), []string{`"k": token.env is empty`}},
		{"token env unset", withKeys(`{"name":"deployment","token":{"env":"NOPE_TOKEN"}}`),
			[]string{`cannot parse providers[0].keys[0] "deployment": token.env names NOPE_TOKEN, which is not set`}},
		{"token env empty value", withKeys(`{"name":"k","token":{"env":"EMPTY_TOKEN"}}`), []string{"token.env names EMPTY_TOKEN, which is empty"}},
		{"token duplicated", withKeys(`{"name":"a","token":{"env":"PINBOARD_TOKEN"}}`, `{"name":"b","token":{"env":"PINBOARD_TOKEN"}}`),
			[]string{`providers[0].keys[1] "b"`, `token of providers[0].keys[0] "a"`}},
		{"scopes not array", withKeys(keyWith(`"scopes":"pinboard:worker"`)), []string{`"k": scopes: want an array, got string`}},
		{"scope not string", withKeys(keyWith(`"scopes":["pinboard:worker",3]`)), []string{`"k": scopes[1]: want a string, got number`}},
		{"scope empty", withKeys(keyWith(`"scopes":[""]`)), []string{`"k": scopes[0]: empty scope`}},
		{"claims not object", withKeys(keyWith(`"claims":[]`)), []string{`"k": claims: want an object, got array`}},
		{"claims.pinboard not object", withKeys(keyWith(`"claims":{"pinboard":true}`)), []string{`"k": claims.pinboard: want an object, got boolean`}},
		{"namespaces not array", withKeys(keyWith(`"claims":{"pinboard":{"namespaces":"*"}}`)), []string{`"k": claims.pinboard.namespaces: want an array, got string`}},
		{"namespace not string", withKeys(keyWith(`"claims":{"pinboard":{"namespaces":["*",null]}}`)), []string{`claims.pinboard.namespaces[1]: want a string, got null`}},
		{"namespace two segments", withKeys(keyWith(`"claims":{"pinboard":{"namespaces":["/a/b"]}}`)), []string{`claims.pinboard.namespaces[0]: namespace pattern "/a/b"`}},
		{"namespace slash only", withKeys(keyWith(`"claims":{"pinboard":{"namespaces":["/"]}}`)), []string{`claims.pinboard.namespaces[0]`, `names no namespace`}},
		{"backend bad CIDR", withKeys(keyWith(`"claims":{"pinboard":{"allowedBackendHosts":["10.0.0/8"]}}`)), []string{`claims.pinboard.allowedBackendHosts[0]: cannot parse CIDR "10.0.0/8"`}},
		{"backend inner wildcard", withKeys(keyWith(`"claims":{"pinboard":{"allowedBackendHosts":["*","work*.internal"]}}`)), []string{`allowedBackendHosts[1]: host pattern "work*.internal"`}},
		{"backend bad port", withKeys(keyWith(`"claims":{"pinboard":{"allowedBackendHosts":["10.0.0.1:99999"]}}`)), []string{`allowedBackendHosts[0]: host pattern "10.0.0.1:99999": port`}},
		{"backend empty", withKeys(keyWith(`"claims":{"pinboard":{"allowedBackendHosts":[""]}}`)), []string{`allowedBackendHosts[0]: empty host pattern`}},
		{"hostnames empty", withKeys(keyWith(`"claims":{"pinboard":{"hostnames":[""]}}`)), []string{`claims.pinboard.hostnames[0]: empty hostname pattern`}},
		{"envs not string", withKeys(keyWith(`"claims":{"pinboard":{"envs":[1]}}`)), []string{`claims.pinboard.envs[0]: want a string, got number`}},
		{"policies not object", withPolicies(`[]`), []string{"cannot parse namespaces: want an object, got array"}},
		{"policy not object", withPolicies(`{"*":"anonymous"}`), []string{`cannot parse namespaces["*"]: want an object, got string`}},
		{"policy allow missing", withPolicies(`{"counters":{}}`), []string{`cannot parse namespaces.counters: allow is required`}},
		{"policy allow unknown", withPolicies(`{"/counters":{"allow":"public"}}`), []string{`cannot parse namespaces["/counters"]: allow: unknown policy "public"`}},
		{"policy allow not string", withPolicies(`{"/counters":{"allow":true}}`), []string{`namespaces["/counters"]: allow: want a string, got boolean`}},
		{"policy scopes bad", withPolicies(`{"/counters":{"allow":"authenticated","scopes":[1]}}`), []string{`namespaces["/counters"]: scopes[0]: want a string, got number`}},
		{"policy empty key", withPolicies(`{"":{"allow":"anonymous"}}`), []string{`namespaces[""]: empty namespace pattern`}},
		{"policy duplicate after normalizing", withPolicies(`{"counters":{"allow":"anonymous"},"/counters":{"allow":"deny"}}`),
			[]string{`namespaces.counters: same namespace pattern as namespaces["/counters"]`}},
		{"policy two segments", withPolicies(`{"/a/b":{"allow":"anonymous"}}`), []string{`namespaces["/a/b"]: namespace pattern "/a/b"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePassport([]byte(tc.raw), testEnv(defaultTestEnv))
			if err == nil {
				t.Fatalf("unexpected success; got %+v; want an error containing %q", p, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("unexpected error;\ngot  %v\nwant it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "tok-") {
				t.Fatalf("error leaks a token value: %v", err)
			}
			if msg := err.Error(); msg != strings.ToLower(msg[:1])+msg[1:] {
				t.Fatalf("error must start lower case: %v", err)
			}
		})
	}
}

func TestParsePassport_UnknownFieldsWarn(t *testing.T) {
	raw := `{"version":2,"providers":[{"type":"staticToken","id":"p","issuer":"x","keys":[
		{"name":"k","token":{"env":"PINBOARD_TOKEN","file":"/x"},"scope":["typo"],
		 "claims":{"custom":1,"pinboard":{"namespaces":["*"],"env":["prod"]}}}]}],
		"namespaces":{"/counters":{"allow":"anonymous","scopes":["x"],"why":"dev"}}}`
	p, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	want := []string{
		"version: unknown field, ignored",
		"providers[0].issuer: unknown field, ignored",
		"providers[0].keys[0].scope: unknown field, ignored",
		"providers[0].keys[0].token.file: unknown field, ignored",
		"providers[0].keys[0].claims.pinboard.env: unknown field, ignored",
		`namespaces["/counters"].why: unknown field, ignored`,
		`namespaces["/counters"].scopes: only "authenticated" policies require scopes; ignored`,
	}
	got := p.Warnings()
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Fatalf("missing warning %q; got %q", w, got)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("unexpected warnings; got %q; want %q", got, want)
	}
	// "claims.custom" is the operator's own claim, not an unknown field.
	if pr := p.Principals()[0]; !strings.Contains(string(pr.AcctJSON), `"custom":1`) {
		t.Fatalf("acct must keep the whole claims object; got %s", pr.AcctJSON)
	}
}

// A member written twice in one object is read as JSON.parse reads it (the
// Node pinboard's passport parser): the last copy wins, and the passport
// still parses. It was taken silently — a "*" policy of "deny" followed by
// one of "anonymous" opened every namespace, a key's second "scopes"
// replaced its first — and is now named among the warnings the binary
// logs at start-up (R-TR-1, R-TR-4).
func TestParsePassport_DuplicateMembersWarn_RTR1_RTR4(t *testing.T) {
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"k","token":{"env":"CLIENT_TOKEN","env":"PINBOARD_TOKEN"},
		 "scopes":["pinboard:operator"],"scopes":["pinboard:worker"],
		 "claims":{"pinboard":{"namespaces":["/a"],"namespaces":["/b"],"allowedBackendHosts":["*"]}}}]}],
		"namespaces":{"*":{"allow":"deny"},"/counters":{"allow":"authenticated"},"*":{"allow":"anonymous"},"*":{"allow":"anonymous"}}}`
	p, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	want := []string{
		`providers[0].keys[0].token: member "env" appears more than once; only the last one is used`,
		`providers[0].keys[0]: member "scopes" appears more than once; only the last one is used`,
		`providers[0].keys[0].claims.pinboard: member "namespaces" appears more than once; only the last one is used`,
		`namespaces: member "*" appears more than once; only the last one is used`,
	}
	if got := p.Warnings(); !slices.Equal(got, want) {
		t.Fatalf("unexpected warnings;\ngot  %q\nwant %q", got, want)
	}
	// The last copy is the one in force, as JSON.parse takes it.
	pr, err := p.Authenticate([]byte("Bearer tok-deployment"))
	if err != nil || pr == nil || !slices.Equal(pr.Scopes, []string{ScopeWorker}) || !pr.Claims.CoversNamespace("/b") || pr.Claims.CoversNamespace("/a") {
		t.Fatalf("unexpected principal for the last copies; got %+v, %v", pr, err)
	}
	if got := p.Admit([]byte("/other"), nil); got != Allow {
		t.Fatalf("unexpected Admit for the last \"*\" policy; got %v; want allow", got)
	}
	// Nothing to warn about in the guide's passport, nor for equal member
	// names in different objects.
	for _, ok := range []string{withKeys(deploymentKey), withPolicies(`{"*":{"allow":"anonymous"},"/a":{"allow":"anonymous"}}`)} {
		if p, err := ParsePassport([]byte(ok), testEnv(defaultTestEnv)); err != nil || len(p.Warnings()) != 0 {
			t.Fatalf("unexpected result for %s; got %v, %v; want no warning", ok, p.Warnings(), err)
		}
	}
}

// A scope that looks meant for pinboard but is not one it checks grants
// nothing: a key with "pinboard:workers" or " pinboard:worker" had its
// worker refused registration with 403, and nothing at start-up said
// why. It is kept (a namespace policy may require any string) and named
// in a warning (R-TR-2).
func TestParsePassport_MisspelledPinboardScopeWarns_RTR2(t *testing.T) {
	raw := withKeys(keyWith(`"scopes":["pinboard:workers","Pinboard:Operator"," pinboard:worker","pinboard:worker","pinboard:operator","app:read"]`))
	p, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	var want []string
	for _, s := range []string{`"pinboard:workers"`, `"Pinboard:Operator"`, `" pinboard:worker"`} {
		want = append(want, "providers[0].keys[0].scopes: "+s+" is not a scope pinboard checks (pinboard:worker, pinboard:operator); kept for namespace policies, it grants nothing else")
	}
	if got := p.Warnings(); !slices.Equal(got, want) {
		t.Fatalf("unexpected warnings;\ngot  %q\nwant %q", got, want)
	}
	if pr := p.Principals()[0]; len(pr.Scopes) != 6 || !pr.HasScope("pinboard:workers") {
		t.Fatalf("unexpected scopes; got %q; want every one kept", pr.Scopes)
	}
}

func TestParsePassport_ScopesAndSubjects_RTR2(t *testing.T) {
	raw := `{"providers":[
		{"type":"staticToken","id":"ops","keys":[{"name":"a","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:operator","custom:x","pinboard:operator"]}]},
		{"type":"staticToken","id":"ci","keys":[{"name":"a","token":{"env":"CLIENT_TOKEN"}}]}]}`
	p, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	prs := p.Principals()
	if got := []string{prs[0].Sub, prs[1].Sub}; !slices.Equal(got, []string{"ops:a", "ci:a"}) {
		t.Fatalf("unexpected subjects; got %q", got)
	}
	if !slices.Equal(prs[0].Scopes, []string{ScopeOperator, "custom:x"}) {
		t.Fatalf("unexpected scopes; got %q; want duplicates dropped, unknown kept", prs[0].Scopes)
	}
	if !prs[0].HasScope("custom:x") || prs[0].HasScope(ScopeWorker) || prs[1].HasScope(ScopeWorker) {
		t.Fatalf("unexpected HasScope results")
	}
	if got, want := string(prs[1].AcctJSON), `{"sub":"ci:a","scopes":[],"claims":{}}`; got != want {
		t.Fatalf("unexpected AcctJSON; got %s; want %s", got, want)
	}
	if prs[1].Claims.CoversNamespace("/x") {
		t.Fatalf("a key without claims must cover nothing")
	}
}

func TestParsePassport_NilLookupUsesEnvironment(t *testing.T) {
	t.Setenv("ATTEST_TEST_TOKEN", "from-env")
	p, err := ParsePassport([]byte(withKeys(`{"name":"k","token":{"env":"ATTEST_TEST_TOKEN"}}`)), nil)
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if pr, err := p.Authenticate([]byte("Bearer from-env")); err != nil || pr == nil {
		t.Fatalf("unexpected Authenticate result; got %v, %v", pr, err)
	}
}

func ExampleParsePassport() {
	raw := `{"providers":[{"type":"staticToken","id":"pinboard","keys":[{"name":"deployment",
		"token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker","pinboard:operator"],
		"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["10.0.0.0/8"]}}}]}],
		"namespaces":{"*":{"allow":"anonymous"}}}`
	env := map[string]string{"PINBOARD_TOKEN": "s3cret"}
	p, err := ParsePassport([]byte(raw), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		fmt.Println(err)
		return
	}
	pr, err := p.Authenticate([]byte("Bearer s3cret"))
	fmt.Println(pr.Sub, err, pr.HasScope(ScopeWorker))
	fmt.Println(pr.Claims.CheckBackend("http://10.0.3.7:8000"))
	fmt.Println(pr.Claims.CheckBackend("http://192.168.1.5:8000"))
	fmt.Println(p.Admit([]byte("/counters"), nil))

	_, err = ParsePassport([]byte(raw), func(string) (string, bool) { return "", false })
	fmt.Println(err)
	// Output:
	// pinboard:deployment <nil> true
	// <nil>
	// advertise host "192.168.1.5:8000" is not in allowedBackendHosts
	// allow
	// cannot parse providers[0].keys[0] "deployment": token.env names PINBOARD_TOKEN, which is not set
}

// A token no Authorization header can carry ("tok\n" from a secret file
// with its trailing newline, an inner space) would leave its key dead,
// every request 401, with no hint why; start-up must fail instead (R-TR-1,
// R-SRV-2).
func TestParsePassport_TokenWithWhiteSpace_RTR1(t *testing.T) {
	for _, tok := range []string{"tok-deployment\n", " tok", "tok en", "tok\t", "tok\r\n", "t\x00k"} {
		p, err := ParsePassport([]byte(withKeys(deploymentKey)), testEnv(map[string]string{"PINBOARD_TOKEN": tok}))
		if err == nil {
			_, aerr := p.Authenticate([]byte("Bearer " + tok))
			t.Errorf("unexpected acceptance of token %q; got nil (Authenticate: %v); want an error naming PINBOARD_TOKEN", tok, aerr)
			continue
		}
		if !strings.Contains(err.Error(), "PINBOARD_TOKEN") || !strings.Contains(err.Error(), `providers[0].keys[0] "deployment"`) {
			t.Errorf("unexpected error for token %q; got %v; want it to name the key and PINBOARD_TOKEN", tok, err)
		}
	}
}

// Two keys must never share an account id: registry calls compare sub to
// decide whose session a heartbeat, release or deregister may touch, and
// workers read acct.sub as the account. Provider "a:b" key "c" and
// provider "a" key "b:c" would both be "a:b:c".
func TestParsePassport_SubCollision_RTR1(t *testing.T) {
	raw := `{"providers":[
		{"type":"staticToken","id":"a:b","keys":[{"name":"c","token":{"env":"PINBOARD_TOKEN"}}]},
		{"type":"staticToken","id":"a","keys":[{"name":"b:c","token":{"env":"CLIENT_TOKEN"}}]}]}`
	p, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
	if err == nil {
		t.Fatalf("unexpected success; got subs %q and %q; want an error", p.Principals()[0].Sub, p.Principals()[1].Sub)
	}
	for _, w := range []string{`providers[1].keys[0] "b:c"`, `account id "a:b:c"`, `providers[0].keys[0] "c"`} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("unexpected error; got %v; want it to contain %q", err, w)
		}
	}
}

// TestParsePassport_ClaimsWorkersCannotRead_RSRV2_RTR5: a key's claims
// ride verbatim in every attestation of its requests (acct), and the
// reference worker parses them with json.loads: an integer of more than
// 4300 digits makes verify_attestation reject the token (ValueError),
// nesting deeper than Python's recursion limit makes it raise (a 500).
// Such a passport started, and every request of that key failed at the
// worker; start-up must refuse it, naming the key (R-SRV-2).
func TestParsePassport_ClaimsWorkersCannotRead_RSRV2_RTR5(t *testing.T) {
	for name, claim := range map[string]string{
		"deep nesting": strings.Repeat("[", 600) + strings.Repeat("]", 600),
	} {
		t.Run(name, func(t *testing.T) {
			raw := withKeys(keyWith(`"claims":{"team":` + claim + `}`))
			_, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
			if err == nil || !strings.Contains(err.Error(), `providers[0].keys[0] "k": claims`) {
				t.Fatalf("unexpected error; got %v; want one naming the key's claims", err)
			}
		})
	}
	// What a worker reads is still accepted: moderate nesting, and numbers
	// past the double range, which reach it as Node's pinboard writes
	// them, null (appendJSNumber; a 4,301-digit integer, kept as written,
	// failed Python's int limit).
	raw := withKeys(keyWith(`"claims":{"team":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `,"n":1e400,"m":` + strings.Repeat("1", 4301) + `}`))
	p, err := ParsePassport([]byte(raw), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if acct := string(p.principals[0].AcctJSON); !strings.HasSuffix(acct, `,"n":null,"m":null}}`) {
		t.Fatalf("unexpected acct; got …%s; want the out-of-range numbers null", acct[max(0, len(acct)-40):])
	}
}
