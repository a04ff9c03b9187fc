package attest

import (
	"bytes"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// ErrInvalidAttestation is wrapped by every VerifyAttestation error; the
// reference worker answers such requests with 403 "invalid attestation".
var ErrInvalidAttestation = errors.New("invalid attestation")

var (
	errAttNotASCII  = fmt.Errorf("%w: token is not ASCII", ErrInvalidAttestation)
	errAttSegments  = fmt.Errorf("%w: want three dot-separated segments", ErrInvalidAttestation)
	errAttSignature = fmt.Errorf("%w: signature does not match", ErrInvalidAttestation)
	errAttBase64    = fmt.Errorf("%w: segment is not base64", ErrInvalidAttestation)
	errAttHeader    = fmt.Errorf(`%w: header is not {"alg":"HS256","typ":"pinboard+jwt"}`, ErrInvalidAttestation)
	errAttClaims    = fmt.Errorf("%w: claims are not a JSON object", ErrInvalidAttestation)
	errAttTimes     = fmt.Errorf("%w: iat and exp must be integers", ErrInvalidAttestation)
	errAttEarly     = fmt.Errorf("%w: issued in the future beyond the clock skew", ErrInvalidAttestation)
	errAttExpired   = fmt.Errorf("%w: expired beyond the clock skew", ErrInvalidAttestation)
	errAttAudience  = fmt.Errorf("%w: audience not accepted", ErrInvalidAttestation)
	errAttCaller    = fmt.Errorf("%w: caller must be a string", ErrInvalidAttestation)
	errAttDepth     = fmt.Errorf("%w: depth must be an integer", ErrInvalidAttestation)
	errAttAcct      = fmt.Errorf(`%w: acct must be {"sub": string, "scopes"?: [string], "claims"?: object}`, ErrInvalidAttestation)
)

// AttestationClaims are the claims of an attestation VerifyAttestation
// accepted.
type AttestationClaims struct {
	// Aud is the aud claim, one of the audiences the caller accepted: the
	// worker's session id for proxied traffic.
	Aud string
	// IssuedAt and Expires are Unix seconds. JSON integers are unbounded
	// in Python, so values beyond int64 are clamped to its range.
	IssuedAt, Expires int64
	// Caller ("ns/id") is set when HasCaller.
	Caller string
	// HasCaller is true when the token has a caller claim (a cluster call,
	// R-TR-6); Caller may then be any string, "" too.
	HasCaller bool
	// Depth is set when HasDepth, clamped to int64 like the times.
	Depth int64
	// HasDepth is true when the token has a depth claim; 0 is a real depth.
	HasDepth bool
	// Acct is the passport principal pinboard authenticated, or nil.
	Acct *Account
}

// Account is a verified attestation's acct claim.
type Account struct {
	// Sub is acct.sub: the principal's "<providerId>:<keyName>" when
	// pinboard minted it (Principal.Sub).
	Sub string
	// Scopes are acct.scopes in signed order; nil when absent, empty when [].
	Scopes []string
	// Claims is the JSON text of acct.claims ("{}" when absent), as signed.
	// It may use Python's NaN/Infinity extensions, which encoding/json
	// rejects; strings may hold lone surrogates in generalized UTF-8.
	Claims []byte
}

// CallerInstance splits Caller the way the reference's attestation() does
// (str.rpartition("/")): "/counters/alice" → ("/counters", "alice"). ok is
// false without a caller or when either part would be empty.
func (c *AttestationClaims) CallerInstance() (ns, id string, ok bool) {
	if !c.HasCaller {
		return "", "", false
	}
	i := strings.LastIndexByte(c.Caller, '/')
	if i <= 0 || i == len(c.Caller)-1 {
		return "", "", false
	}
	return c.Caller[:i], c.Caller[i+1:], true
}

// VerifyAttestation checks token as the reference worker's
// verify_attestation (pinned 0.16.0, pinboard/attestation.py) does, for the
// Go stand-in worker and for tests (R-TR-5). It accepts exactly the tokens
// the reference accepts:
//
//  1. exactly three '.'-separated segments;
//  2. the third equals base64url-unpadded(HMAC-SHA256(secret, first "."
//     second)), compared in constant time; the header's alg never chooses
//     the algorithm;
//  3. header and payload decode with Python's lenient base64 (see
//     pyB64URLDecode) and parse with Python's json.loads (see pyLoads);
//  4. the header equals {"alg":"HS256","typ":"pinboard+jwt"} as a dict
//     (member order, white space and escapes do not matter; no other
//     members) and the payload is an object;
//  5. iat and exp are integers (not floats, not booleans), and
//     iat - 30 <= now <= exp + 30 (exp is not checked against iat);
//  6. aud is a string equal to one of audiences;
//  7. caller, when present, is a string; depth, when present, an integer;
//  8. acct, when present, is an object whose sub is a string, whose scopes,
//     when present, is a list of strings and whose claims, when present, is
//     an object.
//
// Where the reference raises instead of returning None (a non-ASCII token;
// an aud that is a list or object), the worker fails the request, so here
// the token is rejected. The one inexact rule is nesting depth: see pyLoads.
func VerifyAttestation(token string, secret []byte, audiences []string, now time.Time) (*AttestationClaims, error) {
	for i := 0; i < len(token); i++ {
		if token[i] >= 0x80 {
			return nil, errAttNotASCII
		}
	}
	d1, d2, ok := segments(token)
	if !ok {
		return nil, errAttSegments
	}
	m := getMacer()
	defer putMacer(m)
	if !signatureMatches(m, token[:d2], token[d2+1:], secret) {
		return nil, errAttSignature
	}
	// Fast path: the header every minter writes decodes to exactly the
	// expected object; anything else takes the reference's slow path.
	if token[:d1] != headerSegment {
		if err := checkHeader(token[:d1]); err != nil {
			return nil, err
		}
	}
	payload, ok := pyB64URLDecode(m.json[:0], token[d1+1:d2])
	m.json = payload
	if !ok {
		return nil, errAttBase64
	}
	cv, err := pyLoads(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot parse claims: %w", ErrInvalidAttestation, err)
	}
	if cv.kind != pyDict {
		return nil, errAttClaims
	}
	return checkClaims(cv, audiences, now)
}

// AttestationAudience returns the aud claim of token without verifying
// it: the session whose secret would verify it, for a caller that looks
// the secret up first (the proxy's loop check). ok is false when the
// token is not three segments or its payload does not decode to an
// object with a string aud.
func AttestationAudience(token string) (aud string, ok bool) {
	d1, d2, ok := segments(token)
	if !ok {
		return "", false
	}
	payload, ok := pyB64URLDecode(nil, token[d1+1:d2])
	if !ok {
		return "", false
	}
	cv, err := pyLoads(payload)
	if err != nil || cv.kind != pyDict {
		return "", false
	}
	if a := cv.get("aud"); a != nil && a.kind == pyStr {
		return a.str, true
	}
	return "", false
}

// segments returns the indexes of the two dots of a three-segment compact
// JWS, "header.payload.signature"; ok is false for any other count.
func segments(token string) (d1, d2 int, ok bool) {
	d1 = strings.IndexByte(token, '.')
	if d1 < 0 {
		return 0, 0, false
	}
	d2 = strings.IndexByte(token[d1+1:], '.')
	if d2 < 0 {
		return 0, 0, false
	}
	d2 += d1 + 1
	if strings.IndexByte(token[d2+1:], '.') >= 0 {
		return 0, 0, false
	}
	return d1, d2, true
}

// checkHeader applies rules 3 and 4 of VerifyAttestation to the header.
func checkHeader(seg string) error {
	header, ok := pyB64URLDecode(nil, seg)
	if !ok {
		return errAttBase64
	}
	hv, err := pyLoads(header)
	if err != nil {
		return fmt.Errorf("%w: cannot parse header: %w", ErrInvalidAttestation, err)
	}
	if hv.kind != pyDict || len(hv.members) != 2 || !hv.get("alg").isStr("HS256") || !hv.get("typ").isStr("pinboard+jwt") {
		return errAttHeader
	}
	return nil
}

// signatureMatches compares sig to the expected signature of signingInput
// in constant time (the reference uses hmac.compare_digest).
func signatureMatches(m *macer, signingInput, sig string, secret []byte) bool {
	const sigLen = 43 // base64url, unpadded, of 32 bytes
	if len(sig) != sigLen {
		return false
	}
	m.json = append(m.json[:0], signingInput...)
	sum := m.mac(secret, m.json)
	var want, got [sigLen]byte
	base64.RawURLEncoding.Encode(want[:], sum[:])
	copy(got[:], sig)
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// checkClaims applies rules 5 to 8 of VerifyAttestation to a parsed payload.
func checkClaims(cv *pyValue, audiences []string, now time.Time) (*AttestationClaims, error) {
	iat, exp := cv.get("iat"), cv.get("exp")
	if iat == nil || iat.kind != pyInt || exp == nil || exp.kind != pyInt {
		return nil, errAttTimes
	}
	out := &AttestationClaims{}
	out.IssuedAt, _ = iat.int64Value()
	out.Expires, _ = exp.int64Value()
	switch out.window(now) {
	case -1:
		return nil, errAttEarly
	case 1:
		return nil, errAttExpired
	}
	aud := cv.get("aud")
	if aud == nil || aud.kind != pyStr || !slices.Contains(audiences, aud.str) {
		return nil, errAttAudience
	}
	out.Aud = aud.str
	if caller := cv.get("caller"); caller != nil {
		if caller.kind != pyStr {
			return nil, errAttCaller
		}
		out.Caller, out.HasCaller = caller.str, true
	}
	if depth := cv.get("depth"); depth != nil {
		if depth.kind != pyInt {
			return nil, errAttDepth
		}
		out.Depth, _ = depth.int64Value()
		out.HasDepth = true
	}
	if acct := cv.get("acct"); acct != nil {
		a, err := checkAcct(acct)
		if err != nil {
			return nil, err
		}
		out.Acct = a
	}
	return out, nil
}

func checkAcct(acct *pyValue) (*Account, error) {
	if acct.kind != pyDict {
		return nil, errAttAcct
	}
	sub := acct.get("sub")
	if sub == nil || sub.kind != pyStr {
		return nil, errAttAcct
	}
	a := &Account{Sub: sub.str, Claims: []byte("{}")}
	if scopes := acct.get("scopes"); scopes != nil {
		if scopes.kind != pyList {
			return nil, errAttAcct
		}
		a.Scopes = make([]string, 0, len(scopes.list))
		for _, s := range scopes.list {
			if s.kind != pyStr {
				return nil, errAttAcct
			}
			a.Scopes = append(a.Scopes, s.str)
		}
	}
	if claims := acct.get("claims"); claims != nil {
		if claims.kind != pyDict {
			return nil, errAttAcct
		}
		a.Claims = bytes.Clone(claims.raw) // raw points into a pooled buffer
	}
	return a, nil
}

// Within reports whether now lies in the claims' window, the one part
// of VerifyAttestation's verdict that moves with now (rule 5): iat -
// ClockSkew <= now <= exp + ClockSkew, with now's fraction of a second.
// For a verifier that caches a verdict and checks it again at each use.
func (c *AttestationClaims) Within(now time.Time) bool { return c.window(now) == 0 }

// window places now against the claims' window: -1 before it, 1 after
// it, 0 within. Reference: reject when now < iat - skew or now > exp +
// skew, with a float now. Clamping keeps the comparisons right for any
// real clock.
func (c *AttestationClaims) window(now time.Time) int {
	sec, nsec := now.Unix(), now.Nanosecond()
	if lo := satAdd(c.IssuedAt, -skewSeconds); sec < lo {
		return -1
	}
	if hi := satAdd(c.Expires, skewSeconds); sec > hi || sec == hi && nsec > 0 {
		return 1
	}
	return 0
}

// satAdd returns a+b clamped to the int64 range.
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}
