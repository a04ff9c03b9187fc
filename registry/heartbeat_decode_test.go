package registry

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// heartbeatBodies are bodies the fast decoder takes (true) or leaves to
// decode (false).
var heartbeatBodies = []struct {
	body string
	fast bool
}{
	{string(benchHeartbeatBody), true},
	{`{"sessionId":"s","headroom":1,"draining":true,"challenge":"c","challengeValue":"v"}`, true},
	{" \t\r\n{ \"acks\" : [ ] , \"headroom\" : -0.5e+3 }\n", true},
	{`{"acks":["a", "b","c"],"headroom":0,"draining":false}`, true},
	{`{}`, true},
	{`{"headroom":12345678901234567890123}`, true},
	{`{"headroom":1E-2}`, true},
	{`{"headroom":-0}`, true},
	{`{"sessionId":""}`, true},
	{`{"sessionId":"a\"b"}`, false},              // an escape
	{`{"sessionId":"é"}`, false},                 // not ASCII
	{`{"sessionId":null}`, false},                // null
	{`{"sessionId":"a","sessionId":"b"}`, false}, // twice
	{`{"sessionid":"a"}`, false},                 // another case
	{`{"extra":1}`, false},                       // another key
	{`{"headroom":1e400}`, false},                // out of range
	{`{"headroom":01}`, false},                   // not JSON
	{`{"headroom":1.}`, false},
	{`{"headroom":.5}`, false},
	{`{"headroom":+1}`, false},
	{`{"headroom":"1"}`, false},
	{`{"draining":tru}`, false},
	{`{"acks":[1]}`, false},
	{`{"acks":["a",]}`, false},
	{`{"acks":["a"]`, false},
	{`{"acks":["a"]}x`, false},
	{`{"acks":["a"]}{}`, false},
	{`[]`, false},
	{``, false},
	{`{,}`, false},
	{`{"headroom":1,}`, false},
}

// The fast decoder takes the bodies workers send, and decodes them as
// decode does; every other body is left to decode (R-REG-2, R-REG-7).
func TestHeartbeatFastDecode_RREG2(t *testing.T) {
	for _, c := range heartbeatBodies {
		var fast heartbeatBody
		if got := fast.decodeFast([]byte(c.body)); got != c.fast {
			t.Fatalf("unexpected fast decode of %q; got %v; want %v", c.body, got, c.fast)
		}
		if !c.fast {
			if !reflect.DeepEqual(fast, heartbeatBody{}) {
				t.Fatalf("unexpected body left by a refused fast decode of %q: %+v", c.body, fast)
			}
			continue
		}
		wantSameAsDecode(t, []byte(c.body), &fast)
	}
}

// wantSameAsDecode fails unless decode's general path (decodeJSON) takes
// b and fills what fast holds.
func wantSameAsDecode(t *testing.T, b []byte, fast *heartbeatBody) {
	t.Helper()
	var slow heartbeatBody
	if err := decodeJSON(b, &slow); err != nil {
		t.Fatalf("unexpected fast decode of %q, which decode refuses: %v", b, err)
	}
	if !reflect.DeepEqual(*fast, slow) {
		f, _ := json.Marshal(fast)
		s, _ := json.Marshal(slow)
		t.Fatalf("unexpected fast decode of %q; got %s; decode: %s", b, f, s)
	}
}

// FuzzHeartbeatFastDecodeAgrees_RREG2: whatever body the fast decoder
// takes, decode takes too, with the same result.
func FuzzHeartbeatFastDecodeAgrees_RREG2(f *testing.F) {
	for _, c := range heartbeatBodies {
		f.Add([]byte(c.body))
	}
	f.Add([]byte(`{"acks":[` + strings.Repeat(`"0123456789abcdef",`, 100) + `"x"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast heartbeatBody
		if fast.decodeFast(b) {
			wantSameAsDecode(t, b, &fast)
		}
	})
}

// BenchmarkDecodeHeartbeatFast is heartbeatBody.decodeFast on the body the
// reference sends, beside BenchmarkDecodeHeartbeat.
func BenchmarkDecodeHeartbeatFast(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var hb heartbeatBody
		if !hb.decodeFast(benchHeartbeatBody) {
			b.Fatal("refused")
		}
	}
}
