package attest

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

var pyTypeNames = map[pyKind]string{
	pyNone: "NoneType", pyBool: "bool", pyInt: "int", pyFloat: "float", pyStr: "str", pyList: "list", pyDict: "dict",
}

// TestPyLoads_ReferenceCorpus_RTR5 checks pyLoads against json.loads over
// the mutation corpus: accepted exactly when Python accepts, with the same
// top-level type.
func TestPyLoads_ReferenceCorpus_RTR5(t *testing.T) {
	for _, jv := range vectors(t).JSON {
		v, err := pyLoads(jv.B64)
		switch {
		case jv.Type == nil && err == nil:
			t.Errorf("unexpected success for %q; got %s; json.loads raises", jv.B64, pyTypeNames[v.kind])
		case jv.Type != nil && err != nil:
			t.Errorf("unexpected failure for %q: %v; json.loads gives %s", jv.B64, err, *jv.Type)
		case jv.Type != nil && pyTypeNames[v.kind] != *jv.Type:
			t.Errorf("unexpected type for %q; got %s; want %s", jv.B64, pyTypeNames[v.kind], *jv.Type)
		}
	}
}

func TestPyLoads_Values(t *testing.T) {
	v, err := pyLoads([]byte(` {"a":1,"b":"x\u00e9\ud83d\ude00\ud800","a":-12,"c":[NaN,{"d":null}],"e":1.0} `))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if len(v.members) != 4 || v.get("a").str != "-12" || v.get("a").kind != pyInt {
		t.Fatalf("unexpected dict; duplicate keys must keep the last value; got %v %v", v.members, v.get("a"))
	}
	if got, want := v.get("b").str, "xé😀\xed\xa0\x80"; got != want {
		t.Fatalf("unexpected string; got %q; want %q", got, want)
	}
	if c := v.get("c"); string(c.raw) != `[NaN,{"d":null}]` || c.list[0].kind != pyFloat {
		t.Fatalf("unexpected list; got %s", c.raw)
	}
	if v.get("e").kind != pyFloat {
		t.Fatalf("1.0 must be a float")
	}
	if v.get("zz") != nil {
		t.Fatalf("missing keys must be nil")
	}
}

func TestPyLoads_Limits(t *testing.T) {
	deep := strings.Repeat("[", pyMaxDepth) + strings.Repeat("]", pyMaxDepth)
	if _, err := pyLoads([]byte(deep)); err != nil {
		t.Fatalf("unexpected error at the depth limit: %v", err)
	}
	if _, err := pyLoads([]byte("[" + deep + "]")); err != errPyRecursion {
		t.Fatalf("unexpected result past the depth limit; got %v; want %v", err, errPyRecursion)
	}
	big := bytes.Repeat([]byte("9"), pyMaxIntDigits)
	if _, err := pyLoads(big); err != nil {
		t.Fatalf("unexpected error for %d digits: %v", pyMaxIntDigits, err)
	}
	if _, err := pyLoads(append(big, '9')); err != errPyIntDigits {
		t.Fatalf("unexpected result for %d digits; got %v", pyMaxIntDigits+1, err)
	}
	// Many members switch duplicate detection to a map; last still wins.
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < 40; i++ {
		b.WriteString(`"k` + strings.Repeat("x", i) + `":1,`)
	}
	b.WriteString(`"k":2}`)
	v, err := pyLoads([]byte(b.String()))
	if err != nil || len(v.members) != 40 || v.get("k").str != "2" {
		t.Fatalf("unexpected large dict; got %v keys, k=%v, %v", len(v.members), v.get("k"), err)
	}
}

// FuzzPyLoads checks the parser never panics and that what it accepts has a
// raw text that parses to the same kind.
func FuzzPyLoads(f *testing.F) {
	for _, jv := range vectors(f).JSON[:64] {
		f.Add(jv.B64)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := pyLoads(b)
		if err != nil {
			return
		}
		again, err := pyLoads(v.raw)
		if err != nil || again.kind != v.kind {
			t.Fatalf("raw text %q of an accepted value does not parse back: %v", v.raw, err)
		}
	})
}

// FuzzPyLoadsAgreesWithEncodingJSON_RTR5 compares pyLoads with encoding/json
// on UTF-8 text, where the two must agree except on what Python alone
// accepts (NaN, Infinity, -Infinity) or alone refuses (integers past
// 4300 digits, nesting past pyMaxDepth); an accepted document must decode
// to the same tree, duplicate keys keeping the last value (R-TR-5).
func FuzzPyLoadsAgreesWithEncodingJSON_RTR5(f *testing.F) {
	for _, s := range []string{
		`{"aud":"a","iat":1,"exp":2}`, `{"a":1,"a":2}`, `[1,-0,0.5e-3,1E+2,"x\u00e9\ud83d\ude00"]`,
		`"\ud800"`, `"\/\b\f\n\r\t\"\\"`, `NaN`, `[-Infinity]`, `01`, `1.`, `-`, `{"a" : [ ] , "b":{}}`,
		"\t null \r\n", `{"":true,"\u0000":false}`, `123456789012345678901234567890`, `[1,]`, `{,}`,
	} {
		f.Add([]byte(s))
	}
	for _, jv := range vectors(f).JSON[:64] {
		f.Add(jv.B64)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// pyDecodeText reads NUL bytes and BOMs as other encodings.
		if !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 || bytes.HasPrefix(b, []byte("\xef\xbb\xbf")) {
			return
		}
		v, perr := pyLoads(b)
		goOK := json.Valid(b)
		switch {
		case perr == nil && !goOK:
			if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) {
				t.Fatalf("unexpected acceptance of %q, which encoding/json refuses", b)
			}
			return
		case perr != nil && goOK:
			if perr != errPyIntDigits && perr != errPyRecursion {
				t.Fatalf("unexpected refusal of %q, which encoding/json accepts: %v", b, perr)
			}
			return
		case perr != nil:
			return
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("cannot decode %q: %v", b, err)
		}
		if path, ok := samePyValue(v, want); !ok {
			t.Fatalf("unexpected value for %q at %s; pyLoads %s; encoding/json %v", b, path, v.raw, want)
		}
	})
}

// samePyValue compares a pyValue with what encoding/json decodes (numbers
// as json.Number). Strings holding lone surrogates, which encoding/json
// replaces, compare equal whatever they hold.
func samePyValue(v *pyValue, g any) (string, bool) {
	switch g := g.(type) {
	case nil:
		return "", v.kind == pyNone
	case bool:
		return "", v.kind == pyBool && v.truth == g
	case json.Number:
		return "", (v.kind == pyInt || v.kind == pyFloat) && string(v.raw) == string(g) &&
			(v.kind == pyFloat) == strings.ContainsAny(string(g), ".eE")
	case string:
		return "", v.kind == pyStr && (v.str == g || !utf8.ValidString(v.str))
	case []any:
		if v.kind != pyList || len(v.list) != len(g) {
			return "", false
		}
		for i := range g {
			if p, ok := samePyValue(v.list[i], g[i]); !ok {
				return "[" + strconv.Itoa(i) + "]" + p, false
			}
		}
		return "", true
	case map[string]any:
		if v.kind != pyDict {
			return "", false
		}
		valid := 0
		for _, m := range v.members {
			if utf8.ValidString(m.key) {
				valid++
			}
		}
		if valid == len(v.members) && len(g) != valid {
			return "", false
		}
		for _, m := range v.members {
			if !utf8.ValidString(m.key) {
				continue // encoding/json merged it with its U+FFFD twin, if any
			}
			gv, ok := g[m.key]
			if !ok {
				return strconv.Quote(m.key), false
			}
			if p, ok := samePyValue(m.val, gv); !ok {
				return strconv.Quote(m.key) + p, false
			}
		}
		return "", true
	}
	return "", false
}
