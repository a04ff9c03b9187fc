package attest

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// ErrUnauthorized is returned by Authenticate for a credential that is
// malformed or unknown. It deliberately says nothing more: the response to
// a guessed token must not tell the guesser which part was wrong.
var ErrUnauthorized = errors.New("unauthorized")

// Authenticate resolves the raw value of an Authorization header to the
// passport key it presents (R-TR-1). An empty value is an anonymous request:
// (nil, nil). "Bearer <token>" (scheme case-insensitive, RFC 9110 §11.1)
// naming a passport key returns its principal; anything else returns
// (nil, ErrUnauthorized).
//
// Tokens are compared without timing leaks: keys are indexed by the SHA-256
// of their token, so the map probe only ever compares digests (learning
// which digest prefix matched tells an attacker nothing about the token),
// and the hit is confirmed with subtle.ConstantTimeCompare on the full
// token. Authenticate is on the proxy hot path and allocates nothing; it
// does not retain authorization.
func (p *Passport) Authenticate(authorization []byte) (*Principal, error) {
	if len(authorization) == 0 {
		return nil, nil
	}
	token, ok := bearerToken(authorization)
	if !ok {
		return nil, ErrUnauthorized
	}
	c, ok := p.byDigest[sha256.Sum256(token)]
	if !ok || subtle.ConstantTimeCompare(token, c.token) != 1 {
		return nil, ErrUnauthorized
	}
	return c.principal, nil
}

// bearerToken extracts the token of "Bearer <token>" (RFC 6750 §2.1): the
// scheme, one or more spaces, a non-empty token without white space. Trailing
// spaces and tabs are optional white space (RFC 9110 §5.5) and dropped.
func bearerToken(h []byte) ([]byte, bool) {
	const scheme = "bearer"
	if len(h) <= len(scheme) || h[len(scheme)] != ' ' {
		return nil, false
	}
	for i := 0; i < len(scheme); i++ {
		if ascii.LowerByte(h[i]) != scheme[i] {
			return nil, false
		}
	}
	t := h[len(scheme):]
	for len(t) > 0 && t[0] == ' ' {
		t = t[1:]
	}
	for len(t) > 0 && (t[len(t)-1] == ' ' || t[len(t)-1] == '\t') {
		t = t[:len(t)-1]
	}
	if len(t) == 0 {
		return nil, false
	}
	for _, c := range t {
		if c == ' ' || c == '\t' {
			return nil, false
		}
	}
	return t, true
}
