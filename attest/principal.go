package attest

import (
	"encoding/json"
	"fmt"
)

// Scopes pinboard itself checks (R-TR-2). Passports may carry other scope
// strings; they are kept because namespace policies can require them.
const (
	// ScopeWorker allows register, heartbeat, release and deregister.
	ScopeWorker = "pinboard:worker"
	// ScopeOperator allows registry reads, drain and undrain.
	ScopeOperator = "pinboard:operator"
)

// Principal is an authenticated passport key (R-TR-1). Principals are created
// by ParsePassport, shared by every request that presents the key, and must
// be treated as read-only.
type Principal struct {
	// Sub identifies the key as "<providerId>:<keyName>", the form the
	// attestation's acct.sub carries to workers.
	Sub string
	// Provider is the passport provider id; Name the key name within it.
	Provider, Name string
	// Scopes lists the key's scopes in passport order, duplicates removed.
	Scopes []string
	// Claims is the compiled claims.pinboard object (R-TR-3).
	Claims Claims
	// AcctJSON is the compact JSON object
	// {"sub":…,"scopes":[…],"claims":{…}} that attestations carry as "acct"
	// (R-TR-5), precomputed so that minting does no JSON work per request.
	// "claims" is the key's whole claims object ({} when absent), member
	// order kept, strings escaped as Python's json.dumps would.
	AcctJSON []byte
}

// HasScope reports whether the principal holds scope. It allocates nothing.
func (p *Principal) HasScope(scope string) bool {
	for _, s := range p.Scopes {
		if s == scope {
			return true
		}
	}
	return false
}

// appendAcctJSON builds Principal.AcctJSON. claims is the raw claims object
// from the passport, or nil.
func appendAcctJSON(dst []byte, sub string, scopes []string, claims json.RawMessage) ([]byte, error) {
	dst = append(dst, `{"sub":`...)
	dst = appendPyString(dst, sub)
	dst = append(dst, `,"scopes":[`...)
	for i, s := range scopes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendPyString(dst, s)
	}
	dst = append(dst, `],"claims":`...)
	if claims == nil {
		dst = append(dst, "{}"...)
	} else {
		var err error
		if dst, err = appendPyJSON(dst, claims); err != nil {
			return nil, fmt.Errorf("cannot re-encode claims: %w", err)
		}
	}
	return append(dst, '}'), nil
}
