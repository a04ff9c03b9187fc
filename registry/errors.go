package registry

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
)

// Error bodies of the heartbeat reference (003_d935a1d8ec89be7a.txt,
// R-REG-2), byte for byte: workers and operator scripts match on them.
var (
	bodyUnauthorized   = []byte(`{"error":"unauthorized"}`)
	bodyForbidden      = []byte(`{"error":"forbidden"}`)
	bodyNotServing     = []byte(`{"error":"not the serving fleet"}`)
	bodyTooLarge       = []byte(`{"error":"body too large"}`)
	bodyInvalidJSON    = []byte(`{"error":"invalid json"}`)
	bodyHeartbeatShape = []byte(`{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`)
	bodyUnknownSession = []byte(`{"error":"unknown session","reregister":true}`)
	bodyVoided         = []byte(`{"error":"registration voided: challenge value mismatch on the advertise URL","reregister":true}`)
)

// Bodies for the endpoints the reference leaves to us (docs/PROTOCOL.md).
var (
	bodyRegisterShape   = []byte(`{"error":"expected { clientId, secret, namespaces, advertiseUrl, headroom, draining, challenge, challengeValue, hostname?, env?, envs?, takeover?, epoch?, prevSessionId?, instances? }"}`)
	bodyReleaseShape    = []byte(`{"error":"expected [{ sessionId, namespace, id, epoch? }]"}`)
	bodyDeregisterShape = []byte(`{"error":"expected { sessionId }"}`)
	bodyDrainShape      = []byte(`{"error":"expected { clientId, deadline? }"}`)
	bodyUndrainShape    = []byte(`{"error":"expected { clientId }"}`)
	bodyWindDownShape   = []byte(`{"error":"expected { namespace, id, deadline }"}`)
	bodyDeadlineRange   = []byte(`{"error":"deadline must be from 0 to 604800 seconds (7 days)"}`)
	bodyPlacementShape  = []byte(`{"error":"expected ?namespace=&id="}`)
	bodyUnavailable     = []byte(`{"error":"directory unavailable"}`)
	bodyBusy            = []byte(`{"error":"registry busy"}`)
	bodyNotFound        = []byte(`{"error":"not found"}`)
	bodyMethod          = []byte(`{"error":"method not allowed"}`)
	bodyUnknownClient   = []byte(`{"error":"unknown clientId"}`)
	bodyNoPlacement     = []byte(`{"error":"no placement"}`)
	bodyOwnerMoving     = []byte(`{"error":"placement owner changed during the request"}`)
)

func reply(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.SetBodyRaw(body)
}

// replyRetry answers 503 with Retry-After (seconds).
func replyRetry(ctx *fasthttp.RequestCtx, body []byte, seconds int) {
	ctx.Response.Header.Set("Retry-After", strconv.Itoa(seconds))
	reply(ctx, fasthttp.StatusServiceUnavailable, body)
}

func replyJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := marshal(v)
	if err != nil {
		panic("BUG: cannot encode registry reply: " + err.Error())
	}
	reply(ctx, status, b)
}

// marshal is json.Marshal without HTML escaping: the reference (Node's
// JSON.stringify) writes "&", "<" and ">" as they are, and bodies that
// carry names (envs, hostnames, namespaces) must match it byte for byte.
// It writes U+2028 and U+2029 as they are too (unescapeLineSeparators).
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return unescapeLineSeparators(bytes.TrimSuffix(b.Bytes(), []byte{'\n'})), nil
}

// unescapeLineSeparators turns encoding/json's \u2028 and \u2029 back into
// the characters: it escapes them whatever SetEscapeHTML says (for JSONP),
// JSON.stringify never does, and a superseded body names a worker's
// hostname and env (R-REG-2, byte for byte). Every backslash in b starts
// an escape, so an escaped backslash followed by "u2028" is left alone.
func unescapeLineSeparators(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) { // fast path
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			out = append(out, b[i])
			continue
		}
		if rest := b[i+1:]; len(rest) >= 5 && string(rest[:4]) == "u202" && (rest[4] == '8' || rest[4] == '9') {
			out = utf8.AppendRune(out, 0x2020+rune(rest[4]-'0'))
			i += 5
			continue
		}
		out = append(out, b[i], b[i+1]) // another escape: kept whole
		i++
	}
	return out
}

// errorBody builds {"error": msg} for messages with a variable part.
func errorBody(msg string) []byte {
	b, _ := marshal(struct {
		Error string `json:"error"`
	}{msg})
	return b
}

// supersededBody is the heartbeat reference's superseded row (R-LS-4):
// {"error":"registration superseded: {hostname}{ns} now bound to env {env} at epoch {n}","superseded":true}
func supersededBody(e *directory.SupersededError) []byte {
	b, _ := marshal(struct {
		Error      string `json:"error"`
		Superseded bool   `json:"superseded"`
	}{e.Error(), true})
	return b
}
