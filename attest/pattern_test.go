package attest

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

func TestGlobMatch_RTR3(t *testing.T) {
	cases := []struct {
		pattern, s string
		fold, want bool
	}{
		{"*", "", false, true},
		{"*", "counters", false, true},
		{"counters", "counters", false, true},
		{"counters", "counter", false, false},
		{"counters", "countersx", false, false},
		{"count*", "counters", false, true},
		{"count*", "count", false, true},
		{"*ers", "counters", false, true},
		{"c*n*s", "counters", false, true},
		{"c*n*s", "countersx", false, false},
		{"a*a*a", "aaaa", false, true},
		{"a*b", "aXbXb", false, true},
		{"a*b", "aXbXc", false, false},
		{"**", "x", false, true},
		{"Counters", "counters", false, false},
		{"*.example.com", "APP.Example.COM", true, true},
		{"*.example.com", "example.com", true, false},
		{"app.example.com", "app.example.com.evil", true, false},
	}
	for _, tc := range cases {
		if got := globMatch(tc.pattern, tc.s, tc.fold); got != tc.want {
			t.Errorf("unexpected globMatch(%q, %q, %v); got %v; want %v", tc.pattern, tc.s, tc.fold, got, tc.want)
		}
		if got := globMatch(tc.pattern, []byte(tc.s), tc.fold); got != tc.want {
			t.Errorf("unexpected globMatch(%q, []byte(%q)); got %v; want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}

func TestNormalizeNamespacePattern_RTR4(t *testing.T) {
	good := map[string]string{"*": "*", "/*": "*", "counters": "counters", "/counters": "counters", "/count*": "count*"}
	for in, want := range good {
		if got, err := normalizeNamespacePattern(in); err != nil || got != want {
			t.Errorf("unexpected normalizeNamespacePattern(%q); got %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/", "/a/b", "a b", "//a", "a\u00a0b"} {
		if got, err := normalizeNamespacePattern(in); err == nil {
			t.Errorf("unexpected success for %q; got %q", in, got)
		}
	}
}

func TestParseHostPattern_Errors_RTR3(t *testing.T) {
	cases := map[string]string{
		"":                  "empty host pattern",
		"10.0.0/8":          `cannot parse CIDR "10.0.0/8"`,
		"10.0.0.0/33":       "cannot parse CIDR",
		"wor*ker":           "'*' is only allowed",
		"*.":                "hostname",
		"*.a..b":            "empty label",
		"host:0":            "port must be 1..65535",
		"host:65536":        "port must be 1..65535",
		"host:+80":          "port must be 1..65535",
		"host:":             "port must be 1..65535",
		"[::1":              "missing ']'",
		"[worker]:80":       "brackets must hold an IPv6 literal",
		"[::1]x":            `unexpected "x" after ']'`,
		"work er.internal":  "contains",
		"user@host":         "contains",
		"host:80:90x":       "", // three colons: not a valid IPv6 either
		"*.internal:notnum": "port must be 1..65535",
		"*.a*b.internal":    "contains",
	}
	for in, want := range cases {
		_, err := parseHostPattern(in)
		if err == nil {
			t.Errorf("unexpected success for %q", in)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("unexpected error for %q; got %v; want it to contain %q", in, err, want)
		}
	}
}

// FuzzGlobMatch_RTR3_RTR4 compares globMatch with a regular expression built from
// the pattern ('*' as "(?s:.*)", everything else literal), folding with
// ASCII letters lower-cased on both sides (R-TR-3, R-TR-4).
func FuzzGlobMatch_RTR3_RTR4(f *testing.F) {
	f.Add("c*n*s", "counters", false)
	f.Add("*.example.com", "APP.Example.COM", true)
	f.Add("a*a*a", "aaaa", false)
	f.Add("**x*", "\n\nx", false)
	f.Fuzz(func(t *testing.T, pattern, s string, fold bool) {
		if !utf8.ValidString(pattern) || !utf8.ValidString(s) || len(pattern) > 64 || len(s) > 256 {
			return
		}
		if fold {
			pattern = ascii.Lower(pattern)
		}
		parts := strings.Split(pattern, "*")
		for i := range parts {
			parts[i] = regexp.QuoteMeta(parts[i])
		}
		re := regexp.MustCompile(`\A` + strings.Join(parts, `(?s:.*)`) + `\z`)
		subject := s
		if fold {
			subject = ascii.Lower(s)
		}
		if got, want := globMatch(pattern, s, fold), re.MatchString(subject); got != want {
			t.Fatalf("unexpected globMatch(%q, %q, %v); got %v; want %v", pattern, s, fold, got, want)
		}
	})
}
