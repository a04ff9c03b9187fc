package registry

import (
	"errors"
	"reflect"
	"testing"
)

// decode's schema check (R-REG-7): keys are matched exactly, as the
// reference reads them; unknown keys are ignored; arrays of objects are
// checked element by element.
func TestDecodeExactKeys_RREG7(t *testing.T) {
	type item struct {
		SessionID *string `json:"sessionId"`
		ID        *string `json:"id"`
	}
	cases := []struct {
		name string
		body string
		into any
		want error
	}{
		{"exact", `{"sessionId":"s","id":"x"}`, &item{}, nil},
		{"unknown key ignored", `{"sessionId":"s","id":"x","extra":{"SessionId":1}}`, &item{}, nil},
		{"other case", `{"sessionid":"s"}`, &item{}, errShape},
		{"other case later", `{"id":"x","SessionID":"s"}`, &item{}, errShape},
		{"array exact", `[{"sessionId":"s"},{"id":"x"}]`, &[]item{}, nil},
		{"array other case", `[{"sessionId":"s"},{"ID":"x"}]`, &[]item{}, errShape},
		{"array with null", `[null,{"Id":"x"}]`, &[]item{}, errShape},
		{"invalid", `{"sessionId":`, &item{}, errInvalidJSON},
		{"empty", ``, &item{}, errInvalidJSON},
		{"trailing data", `{"id":"x"} {}`, &item{}, errInvalidJSON},
		{"wrong type", `{"id":1}`, &item{}, errShape},
		{"not an object", `"x"`, &item{}, errShape},
		{"number out of range", `{"n":1e400}`, &struct {
			N *float64 `json:"n"`
		}{}, errShape},
		{"escaped key, other case", `{"\u0053essionId":"s"}`, &item{}, errShape},
		{"escaped key, exact", `{"\u0073essionId":"s","i\u0064":"x"}`, &item{}, nil},
		{"braces and quotes inside strings", `{"sessionId":"{\"ID\":1,[","id":"}]"}`, &item{}, nil},
		{"key after a nested object", `{"x":{"a":[1,{"b":2}]},"Id":"x"}`, &item{}, errShape},
		{"key after a nested array", `{"x":[{"Id":1}],"id":"x"}`, &item{}, nil},
		{"value that looks like a key", `{"id":"SessionId","sessionId":"ID"}`, &item{}, nil},
		{"whitespace", " {\n \"id\" : \"x\" ,\t\"SESSIONID\" : 1 } ", &item{}, errShape},
		{"Kelvin sign folds to k", `{"\u212Aey":1}`, &struct {
			Key *int `json:"key"`
		}{}, errShape},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := decode([]byte(tc.body), tc.into); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("unexpected result; got %v; want %v", err, tc.want)
			}
		})
	}
}

// benchHeartbeatBody is a heartbeat body as the reference sends it.
var benchHeartbeatBody = []byte(`{"sessionId":"0123456789abcdef0123456789abcdef","headroom":12.5,"draining":false,` +
	`"challenge":"c0ffee00c0ffee00c0ffee00c0ffee00","challengeValue":"deadbeefdeadbeefdeadbeefdeadbeef","acks":["0123456789abcdef"]}`)

// BenchmarkExactKeys is the schema check on a heartbeat body; it runs on
// every heartbeat (10,000 workers: 3,333 a second).
func BenchmarkExactKeys(b *testing.B) {
	body := benchHeartbeatBody
	t := reflect.TypeFor[heartbeatBody]()
	b.ReportAllocs()
	for b.Loop() {
		if !exactKeys(body, t) {
			b.Fatal("exact keys refused")
		}
	}
}

// BenchmarkDecodeHeartbeat is the whole of decode on a heartbeat body:
// syntax, decoding and the schema check.
func BenchmarkDecodeHeartbeat(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var hb heartbeatBody
		if err := decode(benchHeartbeatBody, &hb); err != nil {
			b.Fatal(err)
		}
	}
}
