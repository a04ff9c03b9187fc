package directory

import (
	"crypto/rand"
	"encoding/hex"
)

// NewSessionID returns 32 hex characters of crypto randomness: session ids
// are attestation audiences, so they must not be guessable.
func NewSessionID() string { return randomHex(16) }

// NewMsgID returns a control message id: 16 hex characters (R-CM-1).
func NewMsgID() string { return randomHex(8) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("BUG: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// appendKey builds the row key "ns\x00id" into dst. NUL cannot occur in a
// valid namespace or id, so keys never collide.
func appendKey(dst []byte, ns, id string) []byte {
	dst = append(dst, ns...)
	dst = append(dst, 0)
	return append(dst, id...)
}

func appendKeyBytes(dst, ns, id []byte) []byte {
	dst = append(dst, ns...)
	dst = append(dst, 0)
	return append(dst, id...)
}
