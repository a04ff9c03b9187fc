package registry

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// decode's schema check (R-REG-7): keys are matched exactly, as the
// reference reads them (body.sessionId): unknown keys are ignored, and so
// are keys naming a field in another case — they neither fill it (as
// encoding/json alone would) nor replace the exact key; arrays of objects
// are read element by element. out is the decoded value, marshalled.
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
		out  string
	}{
		{"exact", `{"sessionId":"s","id":"x"}`, &item{}, nil, `{"sessionId":"s","id":"x"}`},
		{"unknown key ignored", `{"sessionId":"s","id":"x","extra":{"SessionId":1}}`, &item{}, nil, `{"sessionId":"s","id":"x"}`},
		{"other case is not the field", `{"sessionid":"s"}`, &item{}, nil, `{"sessionId":null,"id":null}`},
		{"other case later", `{"id":"x","SessionID":"s"}`, &item{}, nil, `{"sessionId":null,"id":"x"}`},
		{"other case beside the exact key", `{"sessionId":"a","SessionId":"b"}`, &item{}, nil, `{"sessionId":"a","id":null}`},
		{"other case before the exact key", `{"SessionId":"b","sessionId":"a"}`, &item{}, nil, `{"sessionId":"a","id":null}`},
		{"other case of another type", `{"sessionId":"a","SESSIONID":1}`, &item{}, nil, `{"sessionId":"a","id":null}`},
		{"array exact", `[{"sessionId":"s"},{"id":"x"}]`, &[]item{}, nil, `[{"sessionId":"s","id":null},{"sessionId":null,"id":"x"}]`},
		{"array other case", `[{"sessionId":"s"},{"ID":"x","id":"y"}]`, &[]item{}, nil, `[{"sessionId":"s","id":null},{"sessionId":null,"id":"y"}]`},
		{"array with null", `[null,{"Id":"x"}]`, &[]item{}, nil, `[{"sessionId":null,"id":null},{"sessionId":null,"id":null}]`},
		{"duplicate key, the last wins", `{"id":"x","id":"y"}`, &item{}, nil, `{"sessionId":null,"id":"y"}`},
		{"duplicate key, an earlier one of another type", `{"id":1,"id":"x"}`, &item{}, nil, `{"sessionId":null,"id":"x"}`},
		{"duplicate key, the last of another type", `{"id":"x","id":1}`, &item{}, errShape, ""},
		{"array, duplicate key", `[{"id":1,"id":"x"}]`, &[]item{}, nil, `[{"sessionId":null,"id":"x"}]`},
		{"invalid", `{"sessionId":`, &item{}, errInvalidJSON, ""},
		{"empty", ``, &item{}, errInvalidJSON, ""},
		{"trailing data", `{"id":"x"} {}`, &item{}, errInvalidJSON, ""},
		{"wrong type", `{"id":1}`, &item{}, errShape, ""},
		{"not an object", `"x"`, &item{}, errShape, ""},
		{"number out of range", `{"n":1e400}`, &struct {
			N *float64 `json:"n"`
		}{}, errShape, ""},
		{"escaped key, other case", `{"\u0053essionId":"s"}`, &item{}, nil, `{"sessionId":null,"id":null}`},
		{"escaped key, exact", `{"\u0073essionId":"s","i\u0064":"x"}`, &item{}, nil, `{"sessionId":"s","id":"x"}`},
		{"braces and quotes inside strings", `{"sessionId":"{\"ID\":1,[","id":"}]"}`, &item{}, nil, `{"sessionId":"{\"ID\":1,[","id":"}]"}`},
		{"key after a nested object", `{"x":{"a":[1,{"b":2}]},"Id":"x"}`, &item{}, nil, `{"sessionId":null,"id":null}`},
		{"key after a nested array", `{"x":[{"Id":1}],"id":"x"}`, &item{}, nil, `{"sessionId":null,"id":"x"}`},
		{"value that looks like a key", `{"id":"SessionId","sessionId":"ID"}`, &item{}, nil, `{"sessionId":"ID","id":"SessionId"}`},
		{"whitespace", " {\n \"id\" : \"x\" ,\t\"SESSIONID\" : 1 } ", &item{}, nil, `{"sessionId":null,"id":"x"}`},
		{"Kelvin sign folds to k", `{"\u212Aey":1}`, &struct {
			Key *int `json:"key"`
		}{}, nil, `{"key":null}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := decode([]byte(tc.body), tc.into)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("unexpected result; got %v; want %v", err, tc.want)
			}
			if tc.want != nil {
				return
			}
			if out, _ := json.Marshal(tc.into); string(out) != tc.out {
				t.Fatalf("unexpected value; got %s; want %s", out, tc.out)
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

// BenchmarkDecodeHeartbeat is decode's general path (decodeJSON) on a
// heartbeat body: syntax, decoding and the schema check.
func BenchmarkDecodeHeartbeat(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var hb heartbeatBody
		if err := decodeJSON(benchHeartbeatBody, &hb); err != nil {
			b.Fatal(err)
		}
	}
}

// Of an object-valued key given twice the last wins, as with JSON.parse,
// and not the union of the two: encoding/json decodes the second object
// into the map the first filled, so a register body with "instances" or
// "envs" twice reclaimed and bound what the reference never reads
// (R-REG-7, docs/PROTOCOL.md §3).
func TestDecodeDuplicateObjectKeyLastWins_RREG7(t *testing.T) {
	var body registerBody
	err := decode([]byte(`{"instances":{"/a":["x"]},"envs":{"/a":"prod"},"instances":{"/b":["y"]},"envs":{"/b":"staging"}}`), &body)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string][]string{"/b": {"y"}}; !reflect.DeepEqual(body.Instances, want) {
		t.Fatalf("unexpected instances; got %v; want %v", body.Instances, want)
	}
	if want := map[string]string{"/b": "staging"}; !reflect.DeepEqual(body.Envs, want) {
		t.Fatalf("unexpected envs; got %v; want %v", body.Envs, want)
	}
	// The last object replaces the first whole, even when it is empty.
	body = registerBody{}
	if err := decode([]byte(`{"instances":{"/a":["x"]},"instances":{}}`), &body); err != nil || len(body.Instances) != 0 {
		t.Fatalf("unexpected instances; got %v %v; want none", body.Instances, err)
	}
}
