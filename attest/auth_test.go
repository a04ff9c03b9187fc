package attest

import (
	"errors"
	"testing"
)

func authTestPassport(t testing.TB) *Passport {
	t.Helper()
	p, err := ParsePassport([]byte(withKeys(deploymentKey, `{"name":"client","token":{"env":"CLIENT_TOKEN"},"scopes":["app:read"]}`)), testEnv(defaultTestEnv))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	return p
}

func TestAuthenticate_RTR1(t *testing.T) {
	p := authTestPassport(t)
	cases := []struct {
		header  string
		wantSub string // "" with wantErr false = anonymous
		wantErr bool
	}{
		{"", "", false},
		{"Bearer tok-deployment", "pinboard:deployment", false},
		{"bearer tok-client", "pinboard:client", false},
		{"BEARER tok-client", "pinboard:client", false},
		{"Bearer   tok-client  \t", "pinboard:client", false},
		{"Bearer tok-wrong", "", true},
		{"Bearer tok-deploymentx", "", true},
		{"Bearer tok-deploymen", "", true},
		{"Bearer TOK-DEPLOYMENT", "", true},
		{"Bearer", "", true},
		{"Bearer ", "", true},
		{"Bearer    ", "", true},
		{"Bearertok-client", "", true},
		{"Bearer\ttok-client", "", true},
		{"Basic dG9rLWNsaWVudA==", "", true},
		{"Token tok-client", "", true},
		// Another six-letter scheme is not "bearer" (R-TR-1).
		{"Digest tok-client", "", true},
		{"Bearex tok-client", "", true},
		{"tok-client", "", true},
		{"Bearer tok-client extra", "", true},
		{" ", "", true},
	}
	for _, tc := range cases {
		pr, err := p.Authenticate([]byte(tc.header))
		switch {
		case tc.wantErr:
			if !errors.Is(err, ErrUnauthorized) || pr != nil {
				t.Errorf("unexpected result for %q; got %v, %v; want nil, ErrUnauthorized", tc.header, pr, err)
			}
		case tc.wantSub == "":
			if err != nil || pr != nil {
				t.Errorf("unexpected result for %q; got %v, %v; want anonymous (nil, nil)", tc.header, pr, err)
			}
		default:
			if err != nil || pr == nil || pr.Sub != tc.wantSub {
				t.Errorf("unexpected result for %q; got %v, %v; want %s", tc.header, pr, err, tc.wantSub)
			}
		}
	}
}

// TestAuthenticate_ConstantTimeLookup_RTR1 pins the lookup design: keys are
// found by token digest, and a digest hit alone is not enough, the full
// token is compared (subtle.ConstantTimeCompare) before a principal is
// returned.
func TestAuthenticate_ConstantTimeLookup_RTR1(t *testing.T) {
	p := authTestPassport(t)
	for digest, c := range p.byDigest {
		// Forge an entry whose digest matches but whose stored token differs.
		forged := &Passport{byDigest: map[[32]byte]*credential{digest: {token: []byte("other"), principal: c.principal}}}
		if pr, err := forged.Authenticate(append([]byte("Bearer "), c.token...)); err == nil || pr != nil {
			t.Fatalf("unexpected success on a digest hit with a different token; got %v", pr)
		}
	}
}

func TestAuthenticate_ZeroAlloc_RTR1(t *testing.T) {
	p := authTestPassport(t)
	good, bad, empty := []byte("Bearer tok-deployment"), []byte("Bearer nope"), []byte{}
	if n := testing.AllocsPerRun(200, func() {
		if pr, _ := p.Authenticate(good); pr == nil {
			t.Fatal("unexpected miss")
		}
		if _, err := p.Authenticate(bad); err == nil {
			t.Fatal("unexpected hit")
		}
		if pr, err := p.Authenticate(empty); pr != nil || err != nil {
			t.Fatal("unexpected non-anonymous")
		}
		if !p.Principals()[0].HasScope(ScopeOperator) {
			t.Fatal("unexpected HasScope miss")
		}
	}); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}
