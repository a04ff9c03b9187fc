package attest

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppendPyString_EnsureASCII_RTR5(t *testing.T) {
	// Expected values are Python's json.dumps(s) output.
	cases := map[string]string{
		"":                  `""`,
		"plain /counters/a": `"plain /counters/a"`,
		`q"b\s`:             `"q\"b\\s"`,
		"\n\r\t\b\f":        `"\n\r\t\b\f"`,
		"\x00\x01\x1f\x7f":  `"\u0000\u0001\u001f\u007f"`,
		"zähler ✓":          `"z\u00e4hler \u2713"`,
		"😀":                 `"\ud83d\ude00"`,
		"\uffff\u0800":      `"\uffff\u0800"`,
		"bad\xffutf8":       `"bad\ufffdutf8"`,
		"</script>":         `"</script>"`,
	}
	for in, want := range cases {
		if got := string(appendPyString(nil, in)); got != want {
			t.Errorf("unexpected appendPyString(%q); got %s; want %s", in, got, want)
		}
	}
}

func TestAppendPyJSON_KeepsOrderAndEscapes_RTR5(t *testing.T) {
	in := `{ "z" : 1, "a":[ 1.50, -0, 1e3, true, false, null, {} , [] ], "ü":"✓", "s":"\u00e9\/" }`
	want := `{"z":1,"a":[1.5,0,1000,true,false,null,{},[]],"\u00fc":"\u2713","s":"\u00e9/"}`
	got, err := appendPyJSON(nil, []byte(in))
	if err != nil || string(got) != want {
		t.Fatalf("unexpected appendPyJSON; got %s, %v; want %s", got, err, want)
	}
	if _, err := appendPyJSON(nil, []byte(`{"a":}`)); err == nil {
		t.Fatalf("unexpected success on invalid JSON")
	}
}

// Claims' numbers reach the worker as the Node pinboard writes them:
// JSON.stringify of the double JSON.parse read (expected values are
// Node's). Kept as written, "1e6" and "1.0" reached Python as floats
// where Node's pinboard sends ints (R-TR-5).
func TestAppendJSNumber_RTR5(t *testing.T) {
	cases := map[string]string{
		"0": "0", "-0": "0", "-0.0": "0", "1": "1", "1.0": "1", "1.50": "1.5", "1e6": "1000000", "1E+2": "100",
		"-42": "-42", "0.1": "0.1", "0.000001": "0.000001", "0.0000001": "1e-7", "1.5e-7": "1.5e-7",
		"123e-20": "1.23e-18", "1e20": "100000000000000000000", "1e21": "1e+21", "1.7976931348623157e308": "1.7976931348623157e+308",
		"12345678901234567890": "12345678901234567000", "9007199254740993": "9007199254740992",
		"5e-324": "5e-324", "1e-400": "0", "1e400": "null", "-1e400": "null", "1e-100": "1e-100",
	}
	for in, want := range cases {
		if got := string(appendJSNumber(nil, in)); got != want {
			t.Errorf("unexpected appendJSNumber(%s); got %s; want %s", in, got, want)
		}
	}
}

// FuzzAppendPyString_RTR5 checks the ensure_ascii encoder: its output is
// printable ASCII, and both pyLoads and encoding/json read back the
// string (invalid UTF-8 as encoding/json's own encoder writes it, one
// U+FFFD per bad byte) (R-TR-5).
func FuzzAppendPyString_RTR5(f *testing.F) {
	for _, s := range []string{"", "plain", `q"b\s`, "\n\r\t\b\f\x00\x7f", "zähler ✓", "😀", "bad\xffutf8", "\xed\xa0\x80", "\U0010ffff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := appendPyString([]byte("x"), s)[1:]
		for _, c := range enc {
			if c < 0x20 || c >= 0x7f {
				t.Fatalf("unexpected byte %#x in the encoding of %q: %s", c, s, enc)
			}
		}
		want := strings.ToValidUTF8(s, "\ufffd")
		if utf8.ValidString(s) {
			v, err := pyLoads(enc)
			if err != nil || v.kind != pyStr || v.str != s {
				t.Fatalf("unexpected pyLoads of the encoding of %q (%s); got %v, %v", s, enc, v, err)
			}
		} else {
			goEnc, _ := json.Marshal(s)
			if err := json.Unmarshal(goEnc, &want); err != nil {
				t.Fatal(err)
			}
		}
		var got string
		if err := json.Unmarshal(enc, &got); err != nil || got != want {
			t.Fatalf("unexpected encoding/json reading of the encoding of %q (%s); got %q, %v; want %q", s, enc, got, err, want)
		}
	})
}

// FuzzAppendPyJSON_RTR5 checks the claims re-encoder on every document
// encoding/json accepts: the output is ASCII JSON pyLoads and
// encoding/json both accept, with the same members in the same order, and
// numbers as the doubles they denote (R-TR-5).
func FuzzAppendPyJSON_RTR5(f *testing.F) {
	for _, s := range []string{
		`{ "z" : 1, "a":[ 1.50, -0, 1e3, true, false, null, {} , [] ], "ü":"✓", "s":"\u00e9\/" }`,
		`{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["10.0.0.0/8"]}}`, `{"a":1,"a":2}`,
		`[1e400,-1e400,1e-400,12345678901234567890,5e-324]`, `"\ud800"`, `{"\ud800":1,"\udc00":2}`, "{}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		out, err := appendPyJSON(nil, raw)
		if err != nil {
			t.Fatalf("unexpected error re-encoding %q: %v", raw, err)
		}
		for _, c := range out {
			if c < 0x20 || c >= 0x7f {
				t.Fatalf("unexpected byte %#x in %s (from %q)", c, out, raw)
			}
		}
		if _, err := pyLoads(out); err != nil {
			t.Fatalf("unexpected pyLoads of %s (from %q): %v", out, raw, err)
		}
		var got, want any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("unexpected invalid output %s (from %q): %v", out, raw, err)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&want); err != nil {
			t.Fatal(err)
		}
		if !sameJSNumbers(got, want) {
			t.Fatalf("unexpected re-encoding of %q; got %s", raw, out)
		}
	})
}

// sameJSNumbers compares a decoded output (numbers float64) with its
// decoded input (numbers json.Number): a literal past the double range
// must have become null.
func sameJSNumbers(got, want any) bool {
	switch w := want.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(w), 64)
		if err != nil || math.IsInf(f, 0) {
			return got == nil
		}
		g, ok := got.(float64)
		return ok && g == f
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !sameJSNumbers(g[i], w[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k, wv := range w {
			if gv, ok := g[k]; !ok || !sameJSNumbers(gv, wv) {
				return false
			}
		}
		return true
	}
	return got == want
}
