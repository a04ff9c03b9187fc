// Package attest is pinboard's trust layer: the passport (who may call,
// R-TR-1..3), namespace policies (who may reach a namespace, R-TR-4) and the
// proxy attestation pinboard signs onto every forwarded request (R-TR-5).
//
// Files, one concern each:
//
//   - passport.go, decode.go: PINBOARD_PASSPORT parsing with path-named errors.
//   - principal.go: the authenticated identity and its attestation account.
//   - claims.go, pattern.go: what a principal's claims cover.
//   - auth.go: Authorization header → principal (hot path, zero allocations).
//   - policy.go: namespace policies → allow / 401 / 403 (hot path, zero allocations).
//   - attestation.go, mac.go: minting the Pinboard-Attestation JWS (hot path).
//   - verify.go, pyjson.go, pydecode.go, pybase64.go, pyencode.go: the
//     reference worker's verifier, reproduced rule for rule, and the Python
//     wire behaviours it depends on.
//
// Everything a *Passport hands out is immutable after ParsePassport and safe
// for concurrent use.
package attest
