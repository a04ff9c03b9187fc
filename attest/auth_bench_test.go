package attest

import "testing"

func BenchmarkAuthenticate(b *testing.B) {
	p := authTestPassport(b)
	for _, bc := range []struct {
		name   string
		header []byte
	}{
		{"hit", []byte("Bearer tok-deployment")},
		{"miss", []byte("Bearer tok-unknown-0123456789")},
		{"anonymous", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.header)))
			for b.Loop() {
				p.Authenticate(bc.header)
			}
		})
	}
}

func BenchmarkAuthenticateParallel(b *testing.B) {
	p := authTestPassport(b)
	h := []byte("Bearer tok-deployment")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p.Authenticate(h)
		}
	})
}
