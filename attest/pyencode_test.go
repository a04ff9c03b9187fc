package attest

import "testing"

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
