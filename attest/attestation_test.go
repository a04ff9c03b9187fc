package attest

import (
	"encoding/base64"
	"math"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pinboard-go/pinboard/internal/raceflag"
)

func TestHeaderSegment_RTR5(t *testing.T) {
	if got := base64.RawURLEncoding.EncodeToString([]byte(headerJSON)); got != headerSegment {
		t.Fatalf("unexpected header segment; got %s; want %s", got, headerSegment)
	}
}

func TestConstants_MatchReference_RTR5(t *testing.T) {
	v := vectors(t)
	if v.TTL != ttlSeconds || v.Skew != skewSeconds || TTL != 30*time.Second || ClockSkew != 30*time.Second {
		t.Fatalf("unexpected constants; reference ttl=%d skew=%d; ours %v %v", v.TTL, v.Skew, TTL, ClockSkew)
	}
}

// TestAppendAttestation_ReferenceVectors_RTR5 mints every reference token
// again: byte-for-byte equality proves the header, key order, JSON escaping,
// base64 and HMAC all match pinned's mint_attestation (and, for the acct
// vectors, that the reference verifier accepts our format).
func TestAppendAttestation_ReferenceVectors_RTR5(t *testing.T) {
	for _, mv := range vectors(t).Mint {
		in := AttestationInput{Secret: []byte(mv.Secret), Aud: mv.Aud, IssuedAt: mv.IAT, Depth: NoDepth}
		if mv.Caller != nil {
			in.Caller = *mv.Caller
		}
		if mv.Depth != nil {
			in.Depth = *mv.Depth
		}
		if mv.Acct != nil {
			in.Acct = []byte(*mv.Acct)
		}
		if got := string(AppendAttestation(nil, &in)); got != mv.Token {
			t.Errorf("%s: unexpected token;\ngot  %s\nwant %s", mv.Name, got, mv.Token)
		}
		// Appending keeps what dst held.
		if got := string(AppendAttestation([]byte("x:"), &in)); got != "x:"+mv.Token {
			t.Errorf("%s: AppendAttestation must append; got %s", mv.Name, got)
		}
	}
}

// TestAppendAttestation_AcctFromPassport_RTR5 checks that Principal.AcctJSON,
// built from the passport, is the object the reference expects (its own
// json.dumps of {"sub", "scopes", "claims"}), so attestations pinboard mints
// for authenticated clients verify on the worker.
func TestAppendAttestation_AcctFromPassport_RTR5(t *testing.T) {
	for _, av := range vectors(t).Acct {
		p, err := ParsePassport([]byte(av.Passport), testEnv(av.Env))
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		prs := p.Principals()
		if len(prs) != len(av.Keys) {
			t.Fatalf("unexpected principals; got %d; want %d", len(prs), len(av.Keys))
		}
		for i, kv := range av.Keys {
			pr := prs[i]
			if pr.Sub != kv.Sub || string(pr.AcctJSON) != kv.AcctJSON {
				t.Errorf("unexpected acct for %s;\ngot  %s %s\nwant %s %s", kv.Sub, pr.Sub, pr.AcctJSON, kv.Sub, kv.AcctJSON)
			}
			in := AttestationInput{Secret: []byte(av.Secret), Aud: av.Aud, IssuedAt: av.IAT, Depth: NoDepth, Acct: pr.AcctJSON}
			if got := string(AppendAttestation(nil, &in)); got != kv.Token {
				t.Errorf("unexpected token for %s;\ngot  %s\nwant %s", kv.Sub, got, kv.Token)
			}
		}
	}
}

func TestAppendAttestation_OmitsOptionalClaims_RTR5(t *testing.T) {
	in := AttestationInput{Secret: []byte("s"), Aud: "a", IssuedAt: 100, Depth: NoDepth}
	got := appendClaimsJSON(nil, &in)
	if string(got) != `{"aud":"a","iat":100,"exp":130}` {
		t.Fatalf("unexpected claims; got %s", got)
	}
	in.Caller, in.Depth, in.Acct = "/c/i", 0, []byte(`{"sub":"p:k"}`)
	got = appendClaimsJSON(nil, &in)
	if string(got) != `{"aud":"a","iat":100,"exp":130,"caller":"/c/i","depth":0,"acct":{"sub":"p:k"}}` {
		t.Fatalf("unexpected claims; got %s", got)
	}
}

func TestAppendAttestation_ZeroAlloc_RTR5(t *testing.T) {
	if raceflag.Enabled {
		t.Skip("sync.Pool drops items on purpose under -race; run without -race")
	}
	p := authTestPassport(t)
	secret := []byte("4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b")
	inputs := []AttestationInput{
		{Secret: secret, Aud: "d3c1a0f2b4e6a8c0d3c1a0f2b4e6a8c0", IssuedAt: 1700000000, Depth: NoDepth},
		{Secret: secret, Aud: "d3c1a0f2b4e6a8c0d3c1a0f2b4e6a8c0", IssuedAt: 1700000000, Depth: NoDepth, Acct: p.Principals()[0].AcctJSON},
		{Secret: []byte("other-secret"), Aud: "s", IssuedAt: 1700000000, Caller: "/counters/alice", Depth: 2},
	}
	dst := make([]byte, 0, 4096)
	for i := range inputs {
		AppendAttestation(dst[:0], &inputs[i]) // warm the pool
		if n := testing.AllocsPerRun(200, func() {
			dst = AppendAttestation(dst[:0], &inputs[i])
		}); n != 0 {
			t.Fatalf("input %d: unexpected allocations; got %v; want 0", i, n)
		}
	}
}

// FuzzAttestationRoundTrip_RTR5_RTR6 mints an attestation from fuzzed inputs and
// verifies it: every valid UTF-8 aud and caller, any depth and issue time
// within reach of the clock, come back as minted (R-TR-5, R-TR-6).
func FuzzAttestationRoundTrip_RTR5_RTR6(f *testing.F) {
	f.Add([]byte("k"), "sess-1", int64(1700000000), "/counters/alice", 0, true)
	f.Add([]byte(""), "zähler \"✓\"\n", int64(-5), "", -1, false)
	f.Add([]byte("\x00\xff"), "😀\u2028", int64(1<<40), "/a/b/c", 1<<30, true)
	f.Fuzz(func(t *testing.T, secret []byte, aud string, iat int64, caller string, depth int, withAcct bool) {
		if !utf8.ValidString(aud) || !utf8.ValidString(caller) || iat > math.MaxInt64-ttlSeconds {
			return
		}
		in := AttestationInput{Secret: secret, Aud: aud, IssuedAt: iat, Caller: caller, Depth: depth}
		if withAcct {
			in.Acct = []byte(`{"sub":"p:k","scopes":["pinboard:worker"],"claims":{"n":[1,{"x":null}]}}`)
		}
		tok := string(AppendAttestation(nil, &in))
		if aud2, ok := AttestationAudience(tok); !ok || aud2 != aud {
			t.Fatalf("unexpected audience of %s; got %q, %v; want %q", tok, aud2, ok, aud)
		}
		c, err := VerifyAttestation(tok, secret, []string{"other", aud}, time.Unix(iat, 0))
		if err != nil {
			t.Fatalf("unexpected rejection of %s: %v", tok, err)
		}
		if c.Aud != aud || c.IssuedAt != iat || c.Expires != iat+ttlSeconds || c.HasCaller != (caller != "") || c.Caller != caller ||
			c.HasDepth != (depth >= 0) || c.HasDepth && c.Depth != int64(depth) || (c.Acct != nil) != withAcct {
			t.Fatalf("unexpected claims for %+v; got %+v", in, c)
		}
		if withAcct && (c.Acct.Sub != "p:k" || string(c.Acct.Claims) != `{"n":[1,{"x":null}]}`) {
			t.Fatalf("unexpected acct; got %+v", c.Acct)
		}
		if _, err := VerifyAttestation(tok, append(secret, 'x'), []string{aud}, time.Unix(iat, 0)); err == nil {
			t.Fatalf("unexpected acceptance of %s under another secret", tok)
		}
	})
}
