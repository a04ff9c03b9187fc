package attest

import "testing"

func BenchmarkAdmit(b *testing.B) {
	p := policyTestPassport(b)
	pr := p.Principals()[1]
	for _, bc := range []struct {
		name string
		ns   []byte
		pr   *Principal
	}{
		{"exact", []byte("/writes"), pr},
		{"glob", []byte("/chat-admin-x"), pr},
		{"default", []byte("/counters"), pr},
		{"anonymous", []byte("/public"), nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.Admit(bc.ns, bc.pr)
			}
		})
	}
}
