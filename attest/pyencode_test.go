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
	want := `{"z":1,"a":[1.50,-0,1e3,true,false,null,{},[]],"\u00fc":"\u2713","s":"\u00e9/"}`
	got, err := appendPyJSON(nil, []byte(in))
	if err != nil || string(got) != want {
		t.Fatalf("unexpected appendPyJSON; got %s, %v; want %s", got, err, want)
	}
	if _, err := appendPyJSON(nil, []byte(`{"a":}`)); err == nil {
		t.Fatalf("unexpected success on invalid JSON")
	}
}
