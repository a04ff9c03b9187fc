package attest

import (
	"testing"
	"time"
)

func BenchmarkVerifyAttestation(b *testing.B) {
	p := authTestPassport(b)
	secret := []byte("4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b")
	now := time.Unix(1700000000, 0)
	auds := []string{"local", "d3c1a0f2b4e6a8c0d3c1a0f2b4e6a8c0"}
	for _, bc := range []struct {
		name string
		in   AttestationInput
	}{
		{"plain", AttestationInput{Secret: secret, Aud: auds[1], IssuedAt: now.Unix(), Depth: NoDepth}},
		{"acct", AttestationInput{Secret: secret, Aud: auds[1], IssuedAt: now.Unix(), Caller: "/counters/alice", Depth: 1, Acct: p.Principals()[0].AcctJSON}},
	} {
		tok := string(AppendAttestation(nil, &bc.in))
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tok)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := VerifyAttestation(tok, secret, auds, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
