package attest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"math"
	"math/big"
	"slices"
	"testing"
	"time"
)

// clampedInt parses a decimal the reference printed and clamps it to int64,
// as AttestationClaims documents.
func clampedInt(t *testing.T, s string) int64 {
	t.Helper()
	n, ok := new(big.Int).SetString(s, 10)
	if !ok {
		t.Fatalf("bad vector integer %q", s)
	}
	switch {
	case n.IsInt64():
		return n.Int64()
	case n.Sign() > 0:
		return math.MaxInt64
	}
	return math.MinInt64
}

// TestVerifyAttestation_ReferenceVerdicts_RTR5 runs every token the
// reference verifier judged through VerifyAttestation: accepted exactly when
// the reference returned claims (a reference exception fails the worker's
// request, so it counts as rejected), with the same claims.
func TestVerifyAttestation_ReferenceVerdicts_RTR5(t *testing.T) {
	for _, vv := range vectors(t).Verify {
		t.Run(vv.Name, func(t *testing.T) {
			got, err := VerifyAttestation(vv.Token, []byte(vv.Secret), vv.Audiences, pyTime(vv.Now))
			if vv.Result != "accept" {
				if err == nil {
					t.Fatalf("unexpected acceptance; reference %s %s; got %+v", vv.Result, vv.Raises, got)
				}
				if !errors.Is(err, ErrInvalidAttestation) {
					t.Fatalf("unexpected error type; got %v; want ErrInvalidAttestation", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected rejection; reference accepted; got %v", err)
			}
			want := vv.Expect
			if got.Aud != want.Aud || got.IssuedAt != clampedInt(t, want.IAT) || got.Expires != clampedInt(t, want.Exp) {
				t.Fatalf("unexpected claims; got %+v; want %+v", got, want)
			}
			if got.HasCaller != (want.Caller != nil) || want.Caller != nil && got.Caller != *want.Caller {
				t.Fatalf("unexpected caller; got %q %v; want %v", got.Caller, got.HasCaller, want.Caller)
			}
			if got.HasDepth != (want.Depth != nil) || want.Depth != nil && got.Depth != clampedInt(t, *want.Depth) {
				t.Fatalf("unexpected depth; got %d %v; want %v", got.Depth, got.HasDepth, want.Depth)
			}
			if (got.Acct != nil) != (want.Acct != nil) {
				t.Fatalf("unexpected acct; got %+v; want %+v", got.Acct, want.Acct)
			}
			if want.Acct != nil && (got.Acct.Sub != want.Acct.Sub || !slices.Equal(got.Acct.Scopes, want.Acct.Scopes)) {
				t.Fatalf("unexpected acct; got %+v; want %+v", got.Acct, want.Acct)
			}
		})
	}
}

// TestVerifyAttestation_AcceptsOwnMint_RTR5 round-trips Go-minted tokens
// through the Go verifier, including the acct claims object.
func TestVerifyAttestation_AcceptsOwnMint_RTR5(t *testing.T) {
	p := authTestPassport(t)
	pr := p.Principals()[0]
	now := time.Unix(1700000000, 0)
	in := AttestationInput{Secret: []byte("sekret"), Aud: "sess", IssuedAt: now.Unix(), Caller: "/counters/alice", Depth: 1, Acct: pr.AcctJSON}
	tok := string(AppendAttestation(nil, &in))
	c, err := VerifyAttestation(tok, []byte("sekret"), []string{"local", "sess"}, now.Add(45*time.Second))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if c.Acct == nil || c.Acct.Sub != pr.Sub || !slices.Equal(c.Acct.Scopes, pr.Scopes) {
		t.Fatalf("unexpected acct; got %+v", c.Acct)
	}
	if want := `{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}`; string(c.Acct.Claims) != want {
		t.Fatalf("unexpected acct claims; got %s; want %s", c.Acct.Claims, want)
	}
	if ns, id, ok := c.CallerInstance(); !ok || ns != "/counters" || id != "alice" {
		t.Fatalf("unexpected CallerInstance; got %q %q %v", ns, id, ok)
	}
	if _, err := VerifyAttestation(tok, []byte("sekret"), []string{"sess"}, now.Add(61*time.Second)); !errors.Is(err, ErrInvalidAttestation) {
		t.Fatalf("unexpected result 61 s after iat; got %v; want expired", err)
	}
	if _, err := VerifyAttestation(tok, []byte("sekret"), []string{"sess"}, now.Add(-31*time.Second)); !errors.Is(err, ErrInvalidAttestation) {
		t.Fatalf("unexpected result 31 s before iat; got %v; want not yet valid", err)
	}
}

func TestCallerInstance(t *testing.T) {
	cases := []struct {
		caller string
		has    bool
		ns, id string
		wantOK bool
	}{
		{"/counters/alice", true, "/counters", "alice", true},
		{"/a/b/c", true, "/a/b", "c", true},
		{"counters/alice", true, "counters", "alice", true},
		{"/alice", true, "", "", false},
		{"/counters/", true, "", "", false},
		{"alice", true, "", "", false},
		{"/counters/alice", false, "", "", false},
	}
	for _, tc := range cases {
		c := AttestationClaims{Caller: tc.caller, HasCaller: tc.has}
		ns, id, ok := c.CallerInstance()
		if ns != tc.ns || id != tc.id || ok != tc.wantOK {
			t.Errorf("unexpected CallerInstance(%q); got %q %q %v; want %q %q %v", tc.caller, ns, id, ok, tc.ns, tc.id, tc.wantOK)
		}
	}
}

func TestSatAdd(t *testing.T) {
	cases := [][3]int64{
		{1, 2, 3},
		{math.MaxInt64 - 1, 30, math.MaxInt64},
		{math.MinInt64 + 1, -30, math.MinInt64},
		{math.MaxInt64, -30, math.MaxInt64 - 30},
	}
	for _, c := range cases {
		if got := satAdd(c[0], c[1]); got != c[2] {
			t.Errorf("unexpected satAdd(%d, %d); got %d; want %d", c[0], c[1], got, c[2])
		}
	}
}

// Within holds a cached verdict to VerifyAttestation's window (rule 5):
// ClockSkew either side, exp+skew its last whole second.
func TestAttestationClaimsWithin(t *testing.T) {
	c := AttestationClaims{IssuedAt: 1000, Expires: 1060}
	for _, tc := range []struct {
		now  time.Time
		want bool
	}{
		{time.Unix(969, 999999999), false},
		{time.Unix(970, 0), true},
		{time.Unix(1090, 0), true},
		{time.Unix(1090, 1), false},
	} {
		if got := c.Within(tc.now); got != tc.want {
			t.Errorf("unexpected Within(%v); got %v; want %v", tc.now.UnixNano(), got, tc.want)
		}
	}
	far := AttestationClaims{IssuedAt: math.MinInt64, Expires: math.MaxInt64}
	if !far.Within(time.Now()) {
		t.Errorf("unexpected Within for the widest claims; got false; want true")
	}
}

// FuzzVerifyAttestation checks the verifier never panics on signed
// payloads: the fuzzer's bytes become the payload of a correctly signed
// token, so they reach the parser and the claim checks.
func FuzzVerifyAttestation(f *testing.F) {
	f.Add([]byte(`{"aud":"a","iat":100,"exp":130,"acct":{"sub":"x","scopes":["y"],"claims":{}}}`))
	f.Add([]byte(`{"aud":"a","iat":100,"exp":1e3,"depth":true}`))
	secret := []byte("fuzz")
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := getMacer()
		defer putMacer(m)
		signing := headerSegment + "." + base64.RawURLEncoding.EncodeToString(payload)
		sum := m.mac(secret, []byte(signing))
		tok := signing + "." + base64.RawURLEncoding.EncodeToString(sum[:])
		c, err := VerifyAttestation(tok, secret, []string{"a"}, time.Unix(110, 0))
		if err == nil && (c.Aud != "a" || c.IssuedAt > 140 || c.Expires < 80) {
			t.Fatalf("accepted claims outside the rules: %+v", c)
		}
	})
}

// AttestationAudience reads the session an attestation names before its
// secret is known (the proxy's loop check looks the secret up by it), and
// refuses what has no object payload with a string aud (R-TR-5).
func TestAttestationAudience_RTR5(t *testing.T) {
	tok := string(AppendAttestation(nil, &AttestationInput{Secret: []byte("s"), Aud: "sess-1", IssuedAt: 1, Depth: NoDepth}))
	if aud, ok := AttestationAudience(tok); !ok || aud != "sess-1" {
		t.Fatalf("unexpected audience of a minted token; got %q, %v; want sess-1, true", aud, ok)
	}
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, bad := range []string{
		"", "forged", "a.b", "a.!!!.c",
		"a." + b64(`[1]`) + ".c",
		"a." + b64(`{"aud":1}`) + ".c",
		"a." + b64(`{"iat":1}`) + ".c",
		"a." + b64(`{"aud":"x"`) + ".c",
		"a." + b64(`{"aud":"x"}`) + ".c.d", // not three segments: VerifyAttestation refuses it too
		"a." + b64(`{"aud":"x"}`),
	} {
		if aud, ok := AttestationAudience(bad); ok {
			t.Fatalf("unexpected audience of %q; got %q; want none", bad, aud)
		}
	}
}

// signedToken signs header "." payload with secret as the minter does
// (base64url, unpadded, of HMAC-SHA256), whatever the segments hold.
func signedToken(secret, header, payload string) string {
	in := header + "." + payload
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(in))
	return in + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// A token must be ASCII: the reference raises on any byte from 0x80 up,
// so one signed with such a byte in its payload — which Python's lenient
// base64 would otherwise skip — is refused as not ASCII, 0x80 included
// (R-TR-5).
func TestVerifyAttestation_NonASCIISignedTokenRefused_RTR5(t *testing.T) {
	now := time.Unix(1700000000, 0)
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"aud":"sess","iat":1700000000,"exp":1700000030}`))
	if _, err := VerifyAttestation(signedToken("k", headerSegment, payload), []byte("k"), []string{"sess"}, now); err != nil {
		t.Fatalf("unexpected rejection of the ASCII token: %v", err)
	}
	for _, b := range []byte{0x80, 0xc3, 0xff} {
		tok := signedToken("k", headerSegment, payload[:4]+string([]byte{b})+payload[4:])
		if _, err := VerifyAttestation(tok, []byte("k"), []string{"sess"}, now); err != errAttNotASCII {
			t.Errorf("unexpected verdict on a signed token holding byte %#x; got %v; want %v", b, err, errAttNotASCII)
		}
	}
}

// The signature is compared whole, as the reference's compare_digest
// compares the strings: its last character carries only 4 bits of the
// MAC, and every other character in that place is refused, the ones
// that decode to the same bytes included (R-TR-5).
func TestVerifyAttestation_SignatureLastCharacter_RTR5(t *testing.T) {
	now := time.Unix(1700000000, 0)
	in := AttestationInput{Secret: []byte("k"), Aud: "sess", IssuedAt: now.Unix()}
	tok := string(AppendAttestation(nil, &in))
	if _, err := VerifyAttestation(tok, []byte("k"), []string{"sess"}, now); err != nil {
		t.Fatalf("unexpected rejection of a minted token: %v", err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for _, c := range []byte(alphabet) {
		if c == tok[len(tok)-1] {
			continue
		}
		forged := tok[:len(tok)-1] + string(c)
		if _, err := VerifyAttestation(forged, []byte("k"), []string{"sess"}, now); err != errAttSignature {
			t.Fatalf("unexpected verdict with the signature's last character %q for %q; got %v; want %v", c, tok[len(tok)-1], err, errAttSignature)
		}
	}
}

// A signed payload that is JSON but not an object is refused as such,
// before its members are looked for (R-TR-5).
func TestVerifyAttestation_PayloadNotAnObject_RTR5(t *testing.T) {
	for _, p := range []string{`[]`, `"aud"`, `1700000000`, `null`} {
		tok := signedToken("k", headerSegment, base64.RawURLEncoding.EncodeToString([]byte(p)))
		if _, err := VerifyAttestation(tok, []byte("k"), []string{"sess"}, time.Unix(1700000000, 0)); err != errAttClaims {
			t.Errorf("unexpected verdict on the payload %s; got %v; want %v", p, err, errAttClaims)
		}
	}
}

// Account.Claims is the verified token's own: verifying another token
// (whose parse reuses the pooled buffer) leaves it as it was (R-TR-5).
func TestVerifyAttestation_AcctClaimsOutliveNextVerify_RTR5(t *testing.T) {
	now := time.Unix(1700000000, 0)
	verify := func(claims string) *AttestationClaims {
		t.Helper()
		payload := `{"aud":"sess","iat":1700000000,"exp":1700000030,"acct":{"sub":"p:k","claims":` + claims + `}}`
		c, err := VerifyAttestation(signedToken("k", headerSegment, base64.RawURLEncoding.EncodeToString([]byte(payload))), []byte("k"), []string{"sess"}, now)
		if err != nil || c.Acct == nil {
			t.Fatalf("unexpected verdict; got %+v, %v", c, err)
		}
		return c
	}
	first := verify(`{"pinboard":{"namespaces":["/a"]}}`)
	verify(`{"pinboard":{"namespaces":["/zzzzzzzzzzzzzzzzzz"]}}`)
	if want := `{"pinboard":{"namespaces":["/a"]}}`; string(first.Acct.Claims) != want {
		t.Fatalf("unexpected acct claims after another verification; got %s; want %s", first.Acct.Claims, want)
	}
}
