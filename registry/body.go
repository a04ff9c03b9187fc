package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"

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

// readBody returns the request body, at most MaxBody bytes.
func readBody(ctx *fasthttp.RequestCtx) ([]byte, error) {
	if cl := ctx.Request.Header.ContentLength(); cl > MaxBody {
		return nil, errTooLarge
	}
	if !ctx.Request.IsBodyStream() {
		b := ctx.Request.Body()
		if len(b) > MaxBody {
			return nil, errTooLarge
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(ctx.RequestBodyStream(), MaxBody+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxBody {
		return nil, errTooLarge
	}
	return b, nil
}

// decode parses a JSON body into v. Syntax errors are errInvalidJSON;
// well-formed JSON of the wrong shape (a wrong type, a non-object) is
// errShape, answered with the endpoint's "expected { … }" message.
func decode(b []byte, v any) error {
	if !json.Valid(b) {
		return errInvalidJSON
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return errShape
	}
	if !exactKeys(b, reflect.TypeOf(v).Elem()) {
		return errShape
	}
	return nil
}

// exactKeys reports whether no object key in b (top level, or in each
// element of a top-level array) names one of t's fields in another case.
// encoding/json matches keys case-insensitively; the reference reads
// body.sessionId, so {"SESSIONID":…} is a body without sessionId there:
// a schema failure, not a heartbeat.
func exactKeys(b []byte, t reflect.Type) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return false
	}
	switch {
	case tok == json.Delim('{') && t.Kind() == reflect.Struct:
		return objectKeysExact(dec, t)
	case tok == json.Delim('[') && t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return false
			}
			// Scalars and nulls were judged by the decoder already.
			if tok == json.Delim('{') && !objectKeysExact(dec, t.Elem()) {
				return false
			}
		}
	}
	return true
}

// objectKeysExact reads one object's members after its '{', through '}'.
func objectKeysExact(dec *json.Decoder, t reflect.Type) bool {
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		key, _ := tok.(string)
		for i := range t.NumField() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			if name != key && strings.EqualFold(name, key) {
				return false
			}
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false
		}
	}
	_, err := dec.Token() // '}'
	return err == nil
}

// readJSON reads and decodes the body, answering the request itself on
// failure (413, 400 invalid json, 400 with shapeBody). It reports success.
func readJSON(ctx *fasthttp.RequestCtx, v any, shapeBody []byte) bool {
	b, err := readBody(ctx)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			reply(ctx, fasthttp.StatusRequestEntityTooLarge, bodyTooLarge)
		} else {
			reply(ctx, fasthttp.StatusBadRequest, bodyInvalidJSON)
		}
		return false
	}
	if err := decode(b, v); err != nil {
		if errors.Is(err, errInvalidJSON) {
			reply(ctx, fasthttp.StatusBadRequest, bodyInvalidJSON)
		} else {
			reply(ctx, fasthttp.StatusBadRequest, shapeBody)
		}
		return false
	}
	return true
}
