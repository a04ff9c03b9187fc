package attest

import (
	"encoding/base64"
	"strconv"
	"time"
)

// Proxy attestation (R-TR-5). Every request pinboard forwards to a worker
// carries a Pinboard-Attestation header; the worker verifies it with the
// secret it sent at registration and answers 403 "invalid attestation"
// without it. The format is the reference worker's (pinned
// pinboard/attestation.py), a compact JWS:
//
//	base64url(`{"alg":"HS256","typ":"pinboard+jwt"}`)
//	"." base64url(`{"aud":…,"iat":…,"exp":…[,"caller":…][,"depth":…][,"acct":…]}`)
//	"." base64url(HMAC-SHA256(secret, header "." payload))
//
// base64url without padding; JSON compact, keys in that order.

const (
	// HeaderName is the request header carrying the attestation. The proxy
	// strips client-supplied copies before forwarding (R-TR-5).
	HeaderName = "Pinboard-Attestation"

	// TTL is how long an attestation is valid: exp = iat + 30 s.
	TTL = 30 * time.Second
	// ClockSkew is how far the worker's clock may be from pinboard's in
	// either direction before it rejects an attestation.
	ClockSkew = 30 * time.Second

	ttlSeconds  = int64(TTL / time.Second)
	skewSeconds = int64(ClockSkew / time.Second)

	// headerJSON is the JOSE header every attestation carries; the worker
	// compares the decoded header to exactly this object.
	headerJSON = `{"alg":"HS256","typ":"pinboard+jwt"}`
	// headerSegment is base64url(headerJSON), constant for every token.
	headerSegment = "eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9"

	// NoDepth omits "depth" (AttestationInput.Depth).
	NoDepth = -1
)

// AttestationInput is one attestation to mint. Nothing in it is retained.
type AttestationInput struct {
	// Secret is the worker's secret from its register body, used as the
	// HMAC key as is (the reference keys with secret.encode()).
	Secret []byte
	// Aud is the audience: the worker's session id for proxied traffic.
	Aud string
	// IssuedAt is the issue time in Unix seconds (the reference truncates
	// its float clock with int()).
	IssuedAt int64
	// Caller, when not empty, is the attested calling instance as "ns/id"
	// ("/counters/alice") for cluster calls (R-TR-6).
	Caller string
	// Depth is the subrequest depth; a negative value (NoDepth) omits it.
	// Zero is a real depth, sent alongside Caller.
	Depth int
	// Acct, when not nil, is the compact JSON object of the authenticated
	// principal (Principal.AcctJSON), inserted verbatim.
	Acct []byte
}

// AppendAttestation appends the attestation for a to dst and returns the
// extended slice. It allocates nothing when dst has enough spare capacity;
// the pooled signing state makes it safe for concurrent use.
func AppendAttestation(dst []byte, a *AttestationInput) []byte {
	m := getMacer()
	m.json = appendClaimsJSON(m.json[:0], a)
	start := len(dst)
	dst = append(dst, headerSegment...)
	dst = append(dst, '.')
	dst = base64.RawURLEncoding.AppendEncode(dst, m.json)
	sum := m.mac(a.Secret, dst[start:])
	dst = append(dst, '.')
	dst = base64.RawURLEncoding.AppendEncode(dst, sum[:])
	putMacer(m)
	return dst
}

// appendClaimsJSON writes the payload exactly as the reference's
// json.dumps(claims, separators=(",", ":")) does for the same claims.
func appendClaimsJSON(dst []byte, a *AttestationInput) []byte {
	dst = append(dst, `{"aud":`...)
	dst = appendPyString(dst, a.Aud)
	dst = append(dst, `,"iat":`...)
	dst = strconv.AppendInt(dst, a.IssuedAt, 10)
	dst = append(dst, `,"exp":`...)
	dst = strconv.AppendInt(dst, a.IssuedAt+ttlSeconds, 10)
	if a.Caller != "" {
		dst = append(dst, `,"caller":`...)
		dst = appendPyString(dst, a.Caller)
	}
	if a.Depth >= 0 {
		dst = append(dst, `,"depth":`...)
		dst = strconv.AppendInt(dst, int64(a.Depth), 10)
	}
	if a.Acct != nil {
		dst = append(dst, `,"acct":`...)
		dst = append(dst, a.Acct...)
	}
	return append(dst, '}')
}
