package registry

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/pinboard-go/pinboard/directory"
)

// Fuzz tests for the registry's request bodies (R-REG-7): what a worker or
// an operator sends is untrusted. Their seeds are bodies from the tests
// and docs/PROTOCOL.md, so `go test` runs them as ordinary tests.

// bodySeeds are request bodies of every endpoint, as the tests send them.
var bodySeeds = []string{
	string(benchHeartbeatBody),
	`{"sessionId":"s","headroom":50,"draining":false,"challenge":"c","challengeValue":"v"}`,
	`{"sessionId":"s","headroom":50,"draining":false,"challenge":"c","challengeValue":"v","acks":["0123456789abcdef"]}`,
	`{"sessionId":"s","headroom":50,"draining":false,"challenge":"c","challengeValue":"v","acks":[null]}`,
	`{"sessionId":"s","headroom":50,"draining":false,"challenge":"c","challengeValue":"v","SessionId":"zzz","HEADROOM":"x"}`,
	`{"clientId":"c1","secret":"s","namespaces":["/counters"],"advertiseUrl":"http://127.0.0.1:1","headroom":1,"draining":false,"challenge":"c","challengeValue":"v"}`,
	`{"clientId":"c1","secret":"s","namespaces":["/counters","/tickers"],"advertiseUrl":"http://127.0.0.1:1","headroom":100,"draining":false,"challenge":"c","challengeValue":"v","hostname":"app.example","env":"blue","envs":{"/counters":"green"},"takeover":"wind_down","epoch":1700000000000000000,"prevSessionId":"p","instances":{"/counters":["x","y","z"]}}`,
	`{"clientId":"c1","secret":"s","namespaces":["/a\u0000b"],"advertiseUrl":"u","headroom":1,"draining":false,"challenge":"c","challengeValue":"v"}`,
	`{"clientId":"c1","secret":"s","namespaces":["/x\u000by"],"advertiseUrl":"u","headroom":1,"draining":false,"challenge":"c","challengeValue":"v","epoch":1.5}`,
	`[{"sessionId":"s","namespace":"/counters","id":"x","epoch":"7"},{"sessionId":"s","namespace":"/counters","id":"y","epoch":"1"}]`,
	`{"sessionId":"s","namespace":"/counters","id":"y"}`,
	`[{"namespace":"/c","id":"z"}]`,
	`[{"sessionId":"s","namespace":"/c","id":"z","epoch":7}]`,
	`[null,{"Id":"x"}]`,
	`null`,
	`"x"`,
	`{"sessionId":"a","SessionId":"b"}`,
	`{"SessionId":"b","sessionId":"a"}`,
	`{"\u0053essionId":"s"}`,
	`{"\u212Aey":1,"id":"x"}`,
	`{"\u017FessionId":"s","id":"x"}`,
	`{"ſessionId":"s","ID":"x","\u212A":1}`,
	`{"sessionId":1,"sessionId":"s"}`,
	`[{"id":1,"id":"x"}]`,
	`{"sessionId":"{\"ID\":1,[","id":"}]"}`,
	`{"x":[{"Id":1}],"id":"x"}`,
	`{"clientId":"c-1","deadline":30}`,
	`{"clientId":"c-1","deadline":-1}`,
	`{"clientId":"c-1"}`,
	`{"namespace":"/counters","id":"alice","deadline":30}`,
	`{"namespace":"/counters","id":"alice","deadline":null}`,
	`{"namespace":"/counters","id":"alice","deadline":"soon"}`,
	`{"sessionId":`,
	``,
	`{"id":"x"} {}`,
	`{"n":1e400}`,
	`{"id":1,"id":"x"}`,
	`{"instances":{"/a":["x"]},"instances":{"/b":["y"]}}`,
	" {\n \"id\" : \"x\" ,\t\"SESSIONID\" : 1 } ",
}

// refExactKeys is exactKeys the slow way, through encoding/json's maps:
// whether any member key of the top-level object (or of the objects of a
// top-level array) names a field of t only in another case, or names a
// map field a second time.
func refExactKeys(b []byte, t reflect.Type) bool {
	names := fieldNames(t)
	if names == nil {
		return true
	}
	var objs []json.RawMessage
	if t.Kind() == reflect.Slice {
		var elems []json.RawMessage
		if json.Unmarshal(b, &elems) != nil {
			return true
		}
		objs = elems
	} else {
		objs = []json.RawMessage{b}
	}
	counts := map[string]int{}
	for _, o := range objs {
		var m map[string]json.RawMessage
		if len(strings.TrimSpace(string(o))) == 0 || strings.TrimSpace(string(o))[0] != '{' || json.Unmarshal(o, &m) != nil {
			continue
		}
		for k := range m {
			if caseVariant(k, names) {
				return false
			}
		}
		for _, k := range refTopKeys(o) {
			counts[k]++
		}
	}
	for _, name := range mapFieldNames(t) {
		if counts[name] > 1 {
			return false
		}
	}
	return true
}

// refTopKeys returns the member keys of the JSON object o, duplicates
// included, from encoding/json's token stream.
func refTopKeys(o []byte) []string {
	dec := json.NewDecoder(strings.NewReader(string(o)))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return keys
		}
	}
	return keys
}

// refDecodeObject decodes one JSON object into the struct v points to as
// the reference reads it (JSON.parse, then body.field): the last member
// with the exact key wins, other keys are ignored. It reports false when
// the object is not one or a field's value has the wrong type.
func refDecodeObject(b []byte, v reflect.Value) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	if m == nil { // null: encoding/json leaves the struct as it is
		return true
	}
	t := v.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		raw, ok := m[name]
		if !ok {
			continue
		}
		f := reflect.New(t.Field(i).Type)
		if json.Unmarshal(raw, f.Interface()) != nil {
			return false
		}
		v.Field(i).Set(f.Elem())
	}
	return true
}

// checkDecode checks decode's contract on b for the type newV makes.
func checkDecode(t *testing.T, b []byte, newV func() any) {
	v := newV()
	typ := reflect.TypeOf(v).Elem()
	err := decode(b, v)
	// exactKeys takes valid JSON only (decode checks it first).
	if json.Valid(b) {
		if fast, ref := exactKeys(b, typ), refExactKeys(b, typ); fast != ref {
			t.Fatalf("unexpected exactKeys for %q; got %v; want %v (encoding/json's keys)", b, fast, ref)
		}
	}
	if errors.Is(err, errInvalidJSON) {
		if json.Valid(b) {
			t.Fatalf("unexpected invalid json for valid JSON %q", b)
		}
		return
	}
	if !json.Valid(b) {
		t.Fatalf("unexpected result for invalid JSON %q; got %v; want errInvalidJSON", b, err)
	}
	if err != nil && !errors.Is(err, errShape) {
		t.Fatalf("unexpected error for %q; got %v; want nil, errInvalidJSON or errShape", b, err)
	}
	// Valid input is accepted exactly when the reference reads it
	// (JSON.parse: the last of duplicate keys wins), and decodes to what
	// the reference reads.
	want := newV()
	ok := true
	if typ.Kind() == reflect.Slice {
		var elems []json.RawMessage
		ok = json.Unmarshal(b, &elems) == nil
		if elems == nil { // null: encoding/json sets the slice to nil
			reflect.ValueOf(want).Elem().SetZero()
		} else if ok {
			s := reflect.MakeSlice(typ, len(elems), len(elems))
			for i, e := range elems {
				ok = ok && refDecodeObject(e, s.Index(i))
			}
			reflect.ValueOf(want).Elem().Set(s)
		}
	} else {
		ok = refDecodeObject(b, reflect.ValueOf(want).Elem())
	}
	if ok != (err == nil) {
		t.Fatalf("unexpected result for %q; got %v; the reference reads it: %v", b, err, ok)
	}
	if err != nil {
		return
	}
	if !reflect.DeepEqual(v, want) {
		got, _ := json.Marshal(v)
		w, _ := json.Marshal(want)
		t.Fatalf("unexpected decoding of %q; got %s; want %s", b, got, w)
	}
	// What was accepted round-trips: marshalled, it decodes to itself.
	out, err := marshal(v)
	if err != nil {
		t.Fatalf("cannot marshal the decoding of %q: %v", b, err)
	}
	again := newV()
	if err := decode(out, again); err != nil || !reflect.DeepEqual(v, again) {
		t.Fatalf("unexpected round trip of %q through %s; got %v", b, out, err)
	}
}

// FuzzDecodeBodies_RREG7 checks decode and its exact-keys schema check on every
// body type the registry reads: syntax errors are errInvalidJSON, wrong
// shapes errShape, exactKeys agrees with encoding/json's keys, accepted
// input decodes as the reference reads it and round-trips.
func FuzzDecodeBodies_RREG7(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	type deregister struct {
		SessionID *string `json:"sessionId"`
	}
	type drain struct {
		ClientID *string  `json:"clientId"`
		Deadline *float64 `json:"deadline"`
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, func() any { return &heartbeatBody{} })
		checkDecode(t, b, func() any { return &registerBody{} })
		checkDecode(t, b, func() any { return &[]releaseItem{} })
		checkDecode(t, b, func() any { return &releaseItem{} })
		checkDecode(t, b, func() any { return &deregister{} })
		checkDecode(t, b, func() any { return &drain{} })
	})
}

// FuzzRegisterValidate_RREG1_RREG7 checks what validate admits: every namespace is "/"
// plus one segment without "/", ASCII white space or NUL (the documented
// rule, docs/PROTOCOL.md), no NUL in a name the stores separate with it,
// an integral epoch in [0, 2^63), tokens of 1..512 bytes; and an accepted
// body, marshalled again, validates to the same registration.
func FuzzRegisterValidate_RREG1_RREG7(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var body registerBody
		if decode(b, &body) != nil {
			return
		}
		reg := body.validate()
		if reg == nil {
			return
		}
		okNS := func(ns string) bool {
			return len(ns) > 1 && ns[0] == '/' && !strings.ContainsAny(ns[1:], "/ \t\n\r\f\x00")
		}
		for _, ns := range reg.Namespaces {
			if !okNS(ns) {
				t.Fatalf("unexpected acceptance of namespace %q in %q", ns, b)
			}
		}
		for ns, ids := range reg.Instances {
			if !okNS(ns) {
				t.Fatalf("unexpected acceptance of instances namespace %q in %q", ns, b)
			}
			for _, id := range ids {
				if directory.CheckID(id) != nil {
					t.Fatalf("unexpected acceptance of id %q in %q", id, b)
				}
			}
		}
		for _, s := range []string{reg.ClientID, reg.Hostname, reg.Env} {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("unexpected acceptance of a NUL in %q", b)
			}
		}
		for _, s := range reg.Envs {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("unexpected acceptance of a NUL in envs of %q", b)
			}
		}
		for _, s := range []string{reg.ClientID, reg.Secret, *body.Challenge, *body.ChallengeValue} {
			if !token(s) {
				t.Fatalf("unexpected acceptance of token %q in %q", s, b)
			}
		}
		if reg.Epoch < 0 || (body.Epoch != nil && float64(reg.Epoch) != *body.Epoch && *body.Epoch < 1<<53) {
			t.Fatalf("unexpected epoch %d for %v in %q", reg.Epoch, body.Epoch, b)
		}
		if reg.Takeover != "" && reg.Takeover != "wind_down" && reg.Takeover != "deny" {
			t.Fatalf("unexpected takeover %q in %q", reg.Takeover, b)
		}
		out, err := marshal(&body)
		if err != nil {
			t.Fatalf("cannot marshal %q: %v", b, err)
		}
		var again registerBody
		if err := decode(out, &again); err != nil {
			t.Fatalf("cannot decode %s again: %v", out, err)
		}
		if reg2 := again.validate(); reg2 == nil || !reflect.DeepEqual(reg, reg2) {
			t.Fatalf("unexpected revalidation of %s; got %+v; want %+v", out, reg2, reg)
		}
	})
}
