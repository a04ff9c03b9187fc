package registry

import (
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// MaxBody is the registry request body limit (R-REG-7): 1 MiB. The server
// streams request bodies for the proxy, so fasthttp's own limit does not
// apply here (../shared/notes/FASTHTTP.md); readBody enforces it.
const MaxBody = 1 << 20

var (
	errTooLarge    = errors.New("body too large")
	errInvalidJSON = errors.New("invalid json")
	errShape       = errors.New("schema failure")
)

// readBody returns the request body, at most MaxBody bytes. A body read
// in pieces renews the read deadline before each (Options.BodyStall); one
// still arriving when the request came in was read off the pool
// (Registry.preread).
func (r *Registry) readBody(ctx *fasthttp.RequestCtx) ([]byte, error) {
	if pre, ok := ctx.UserValue(prereadKey{}).(*prereadBody); ok {
		return pre.b, pre.err // read before the pool task (Registry.preread)
	}
	if cl := ctx.Request.Header.ContentLength(); cl > MaxBody {
		ctx.SetConnectionClose()
		if ctx.Request.IsBodyStream() && cl <= MaxBody+overDrain {
			r.discard(ctx, int64(cl))
		}
		return nil, errTooLarge
	}
	if !ctx.Request.IsBodyStream() {
		b := ctx.Request.Body()
		if len(b) > MaxBody {
			return nil, errTooLarge
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.bodyStream(ctx), MaxBody+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxBody {
		r.discard(ctx, overDrain)
		// The connection closes after the 413, and the answer says so
		// (RFC 9112 section 9.6): the body may go on past overDrain.
		// fasthttp decides that alone, before writing the answer, for a
		// body of known length only; a chunked one's 413 went out without
		// Connection: close, and with more left than fasthttp discards
		// (256 KiB) it closed the connection all the same, under a
		// client's next request (TestRegistryBodyTooLargeClosesConnection_RREG7).
		ctx.SetConnectionClose()
		return nil, errTooLarge
	}
	return b, nil
}

// overDrain is how much of a body past MaxBody a node reads and throws
// away before its 413. A client that sends its whole body before reading
// the answer, as most do, otherwise lost the answer: the connection,
// closed with the body unread, sent a reset that overtook the 413, and
// the client saw "connection reset by peer" on its write
// (TestOversizeBodyAnsweredNotReset_RREG7_RREG2). A body longer than
// this is still cut: it costs the node at most another MiB to read, and
// only a caller with a worker or operator key gets this far (preread).
const overDrain = MaxBody

// discard reads and drops up to n more bytes of the request body.
func (r *Registry) discard(ctx *fasthttp.RequestCtx, n int64) {
	_, _ = io.CopyN(io.Discard, r.bodyStream(ctx), n)
}

// bodyStream is the streamed request body, each read under the stall
// deadline (Options.BodyStall) when one is set.
func (r *Registry) bodyStream(ctx *fasthttp.RequestCtx) io.Reader {
	src := ctx.RequestBodyStream()
	if r.stall > 0 {
		return stallReader{r: src, c: ctx.Conn(), stall: r.stall}
	}
	return src
}

// stallReader pushes c's read deadline stall away before each read of r:
// a body must keep moving, not arrive whole within one deadline. The
// server renews the answer's write deadline once ServeHTTP returns.
type stallReader struct {
	r     io.Reader
	c     net.Conn
	stall time.Duration
}

func (s stallReader) Read(p []byte) (int, error) {
	_ = s.c.SetReadDeadline(time.Now().Add(s.stall))
	return s.r.Read(p)
}

// decode parses a JSON body into v. Syntax errors are errInvalidJSON;
// well-formed JSON of the wrong shape (a wrong type, a non-object) is
// errShape, answered with the endpoint's "expected { … }" message. A body
// type with a decoder of its own for the form clients send (fastBody)
// is read by it first.
func decode(b []byte, v any) error {
	if fb, ok := v.(fastBody); ok && fb.decodeFast(b) {
		return nil
	}
	return decodeJSON(b, v)
}

// fastBody is a request body type with a decoder of its own for the form
// its clients send, which must decode every body it takes exactly as
// decodeJSON does and leave the rest (ok false, the body untouched) to
// it: heartbeatBody (heartbeat_decode.go).
type fastBody interface {
	decodeFast(b []byte) bool
}

// decodeJSON is decode's general path, every body read as the reference
// reads it. One json.Unmarshal checks the syntax and decodes: it checks
// the whole input before it decodes anything, and a syntax error is its
// own type.
func decodeJSON(b []byte, v any) error {
	t := reflect.TypeOf(v).Elem()
	if err := json.Unmarshal(b, v); err != nil {
		if _, ok := errors.AsType[*json.SyntaxError](err); ok {
			return errInvalidJSON
		}
		// The wrong type may be under a key in another case, which the
		// reference never reads, or under an earlier duplicate of a key,
		// which JSON.parse replaces with the last: decodeExact reads the
		// body as the reference does (a rare path: the body was refused).
		return decodeExact(b, v, t)
	}
	if !exactKeys(b, t) {
		return decodeExact(b, v, t)
	}
	return nil
}

// decodeExact decodes b into v as the reference reads it (JSON.parse, then
// body.sessionId): of duplicate keys the last wins, and members whose key
// names a field only in another case are dropped, so they neither fill the
// field (encoding/json would match them) nor replace the exactly named
// member. A rare path: a body exactKeys found such a key in, or one
// encoding/json refused.
func decodeExact(b []byte, v any, t reflect.Type) error {
	names := fieldNames(t)
	variant := func(k string, _ json.RawMessage) bool { return caseVariant(k, names) }
	var clean []byte
	var err error
	if t.Kind() == reflect.Slice {
		var elems []map[string]json.RawMessage
		if json.Unmarshal(b, &elems) != nil {
			return errShape
		}
		for _, m := range elems {
			maps.DeleteFunc(m, variant)
		}
		clean, err = json.Marshal(elems)
	} else {
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil {
			return errShape
		}
		maps.DeleteFunc(m, variant)
		clean, err = json.Marshal(m)
	}
	if err != nil {
		return errShape
	}
	reflect.ValueOf(v).Elem().SetZero()
	if json.Unmarshal(clean, v) != nil {
		return errShape
	}
	return nil
}

// exactKeys reports whether no object key in b (top level, or in each
// element of a top-level array) names one of t's fields in another case.
// encoding/json matches keys case-insensitively; the reference reads
// body.sessionId, so {"SESSIONID":…} is a body without sessionId there (a
// schema failure, not a heartbeat), and {"sessionId":"a","SessionId":"b"}
// is session a: decode then goes the slow way (decodeExact). b is valid
// JSON (decode checked).
//
// One pass over the bytes, no tokens: it runs on every heartbeat, and
// encoding/json's token stream cost as much as the rest of the heartbeat's
// decoding (BenchmarkExactKeys).
//
// A key naming a map field that comes twice goes the slow way too: of a
// key given twice JSON.parse keeps the last, and encoding/json does so
// for every other field, but decodes the second object into the map the
// first one filled — {"instances":{…},"instances":{…}} would be both.
// (In an array body a map field's key in two elements takes the slow way
// as well; it is right too, only slower.)
func exactKeys(b []byte, t reflect.Type) bool {
	names := fieldNames(t)
	if names == nil {
		return true
	}
	mapNames := mapFieldNames(t)
	var seen []string // map fields met so far: a handful at most
	return eachMemberKey(b, t.Kind() == reflect.Slice, func(key []byte) bool {
		if caseVariant(string(key), names) {
			return false
		}
		if len(mapNames) > 0 && slices.Contains(mapNames, string(key)) {
			if slices.Contains(seen, string(key)) {
				return false
			}
			seen = append(seen, string(key))
		}
		return true
	})
}

// mapFieldsOf caches mapFieldNames by type: exactKeys runs on every
// heartbeat, and the walk over the fields cost half its time.
var mapFieldsOf sync.Map // reflect.Type → []string

// mapFieldNames returns the JSON names of the map fields of t, a struct
// or a slice of structs.
func mapFieldNames(t reflect.Type) []string {
	if names, ok := mapFieldsOf.Load(t); ok {
		return names.([]string)
	}
	names := walkMapFields(t)
	mapFieldsOf.Store(t, names)
	return names
}

func walkMapFields(t reflect.Type) []string {
	if t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if ft.Kind() == reflect.Map && name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// fieldNames returns the JSON names of the fields of t, a struct or a
// slice of structs; nil for anything else.
func fieldNames(t reflect.Type) []string {
	switch {
	case t.Kind() == reflect.Struct:
		return jsonNames(t)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return jsonNames(t.Elem())
	}
	return nil
}

// caseVariant reports whether key names one of the fields only in another
// case: encoding/json would fill the field from it, the reference not.
func caseVariant(key string, names []string) bool {
	for _, name := range names {
		if key == name {
			return false
		}
	}
	for _, name := range names {
		if strings.EqualFold(name, key) {
			return true
		}
	}
	return false
}

// jsonNames returns the JSON names of t's fields.
func jsonNames(t reflect.Type) []string {
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// eachMemberKey calls fn with the unescaped key of every member of b's
// top-level object, or with array set, of every object element of b's
// top-level array, and stops with false when fn does. b must be valid
// JSON; keys of deeper objects are not visited.
func eachMemberKey(b []byte, array bool, fn func(key []byte) bool) bool {
	target := 1 // the depth of the objects whose keys count
	if array {
		target = 2
	}
	depth := 0
	var top byte          // the top-level container: '{' or '['
	targetObject := false // the container at depth target is an object
	var prev byte         // the last structural byte outside strings
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '{', '[':
			depth++
			if depth == 1 {
				top = c
			}
			if depth == target {
				targetObject = c == '{' && (!array || top == '[')
			}
			prev = c
		case '}', ']':
			depth--
			prev = c
		case ',', ':':
			prev = c
		case '"':
			end, escaped := stringEnd(b, i)
			if depth == target && targetObject && (prev == '{' || prev == ',') {
				key := b[i+1 : end]
				if escaped {
					var s string
					if json.Unmarshal(b[i:end+1], &s) != nil {
						return false
					}
					key = []byte(s)
				}
				if !fn(key) {
					return false
				}
			}
			i = end
			prev = '"'
		}
	}
	return true
}

// stringEnd returns the index of the quote closing the string that opens
// at b[start], and whether the string holds an escape.
func stringEnd(b []byte, start int) (int, bool) {
	escaped := false
	for i := start + 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			escaped = true
			i++
		case '"':
			return i, escaped
		}
	}
	return len(b) - 1, escaped
}

// readJSON reads and decodes the body, answering the request itself on
// failure (413, 400 invalid json, 400 with shapeBody). It reports success.
func (r *Registry) readJSON(ctx *fasthttp.RequestCtx, v any, shapeBody []byte) bool {
	b, ok := r.bodyOrReply(ctx)
	if !ok {
		return false
	}
	if err := decode(b, v); err != nil {
		replyDecodeError(ctx, err, shapeBody)
		return false
	}
	return true
}

// bodyOrReply is readBody answering the request itself on failure: 413 for
// a body past MaxBody, 400 invalid json for one that could not be read. It
// reports whether b is the body.
func (r *Registry) bodyOrReply(ctx *fasthttp.RequestCtx) (b []byte, ok bool) {
	b, err := r.readBody(ctx)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			reply(ctx, fasthttp.StatusRequestEntityTooLarge, bodyTooLarge)
		} else {
			reply(ctx, fasthttp.StatusBadRequest, bodyInvalidJSON)
		}
		return nil, false
	}
	return b, true
}

// replyDecodeError answers a body decode refused (err from decode): 400
// invalid json for a syntax error, 400 with shapeBody for the wrong shape.
func replyDecodeError(ctx *fasthttp.RequestCtx, err error, shapeBody []byte) {
	if errors.Is(err, errInvalidJSON) {
		reply(ctx, fasthttp.StatusBadRequest, bodyInvalidJSON)
	} else {
		reply(ctx, fasthttp.StatusBadRequest, shapeBody)
	}
}
