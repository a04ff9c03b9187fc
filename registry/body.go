package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

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
	return nil
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
