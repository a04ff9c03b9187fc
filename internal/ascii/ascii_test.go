package ascii

import "testing"

func TestLowerAndEqualFold(t *testing.T) {
	for _, tc := range []struct{ in, lower string }{
		{"", ""}, {"app.example", "app.example"}, {"APP.Example", "app.example"},
		{"ÅPP.example", "Åpp.example"}, {"wor\u212aer", "wor\u212aer"}, {"A-1_Z", "a-1_z"},
	} {
		if got := Lower(tc.in); got != tc.lower {
			t.Errorf("unexpected Lower(%q); got %q; want %q", tc.in, got, tc.lower)
		}
		if got := string(AppendLower([]byte("x:"), tc.in)); got != "x:"+tc.lower {
			t.Errorf("unexpected AppendLower(x:, %q); got %q; want %q", tc.in, got, "x:"+tc.lower)
		}
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"app.example", "APP.EXAMPLE", true}, {"ÅPP.example", "Åpp.EXAMPLE", true},
		{"ÅPP.example", "åpp.example", false}, {"worker", "wor\u212aer", false},
		{"svc", "\u017fvc", false}, {"a", "ab", false}, {"@", "`", false}, {"", "", true},
	} {
		if got := EqualFold(tc.a, tc.b); got != tc.want {
			t.Errorf("unexpected EqualFold(%q, %q); got %v; want %v", tc.a, tc.b, got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = EqualFold("App.Example", "app.EXAMPLE"); _ = Lower("app.example") }); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}

func TestIndexSpaceOrCtl(t *testing.T) {
	for s, want := range map[string]int{"": -1, "tok-en_1": -1, "tok\n": 3, " tok": 0, "t\x00k": 1, "t\x7fk": 1, "ünï": -1} {
		if got := IndexSpaceOrCtl(s); got != want {
			t.Errorf("unexpected IndexSpaceOrCtl(%q); got %d; want %d", s, got, want)
		}
	}
}

func TestIsHex(t *testing.T) {
	for c := 0; c < 256; c++ {
		want := '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
		if got := IsHex(byte(c)); got != want {
			t.Errorf("unexpected IsHex(%q); got %v; want %v", rune(c), got, want)
		}
	}
}
