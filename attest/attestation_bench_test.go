package attest

import "testing"

func BenchmarkAppendAttestation(b *testing.B) {
	p := authTestPassport(b)
	secret := []byte("4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b")
	for _, bc := range []struct {
		name string
		in   AttestationInput
	}{
		{"plain", AttestationInput{Secret: secret, Aud: "d3c1a0f2b4e6a8c0d3c1a0f2b4e6a8c0", IssuedAt: 1700000000, Depth: NoDepth}},
		{"caller", AttestationInput{Secret: secret, Aud: "d3c1a0f2b4e6a8c0d3c1a0f2b4e6a8c0", IssuedAt: 1700000000, Caller: "/counters/alice", Depth: 1}},
		{"acct", AttestationInput{Secret: secret, Aud: "d3c1a0f2b4e6a8c0d3c1a0f2b4e6a8c0", IssuedAt: 1700000000, Depth: NoDepth, Acct: p.Principals()[0].AcctJSON}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dst := AppendAttestation(nil, &bc.in)
			b.SetBytes(int64(len(dst)))
			b.ReportAllocs()
			for b.Loop() {
				dst = AppendAttestation(dst[:0], &bc.in)
			}
		})
	}
}

func BenchmarkAppendAttestationParallel(b *testing.B) {
	in := AttestationInput{Secret: []byte("4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b"), Aud: "d3c1a0f2b4e6a8c0", IssuedAt: 1700000000, Depth: NoDepth}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]byte, 0, 512)
		for pb.Next() {
			dst = AppendAttestation(dst[:0], &in)
		}
	})
}
