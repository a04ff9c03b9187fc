package directory

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
)

// MaxIDLen is the reference worker's id limit (pinned.pinboard.wire:
// invalid_id_reason).
const MaxIDLen = 256

// Why CheckID refuses an id.
var (
	ErrEmptyID   = errors.New("id must be non-empty")
	ErrLongID    = errors.New("id must be at most 256 characters")
	ErrIDCharset = errors.New("id must contain only [A-Za-z0-9._~-]")
	ErrDotID     = errors.New("id must not be a dot segment (. or ..)")
)

// CheckID applies the reference worker's id rule (pinned.pinboard.wire:
// invalid_id_reason): 1..256 characters of [A-Za-z0-9._~-], not "." or
// "..". Every id a store holds passes it — the data plane routes nothing
// else, and no NUL can join a row key (appendKey) to another row's. It
// does not allocate.
func CheckID[T ~string | ~[]byte](id T) error {
	if len(id) == 0 {
		return ErrEmptyID
	}
	if len(id) > MaxIDLen {
		return ErrLongID
	}
	for i := 0; i < len(id); i++ {
		if !idChar[id[i]] {
			return ErrIDCharset
		}
	}
	if string(id) == "." || string(id) == ".." {
		return ErrDotID
	}
	return nil
}

var idChar = func() (t [256]bool) {
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "._~-" {
		t[c] = true
	}
	return t
}()

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

// lookupKeyLen is the stack buffer a Lookup builds its key in: the
// longest id (MaxIDLen) under a namespace of up to about 60 bytes, with
// the Redis key's prefix. Namespaces have no bound of their own (any
// single path segment a worker registers), so longer keys are built in a
// keyPool buffer instead: a Lookup allocates nothing either way.
const lookupKeyLen = 320

// keyPool holds key buffers for keys longer than lookupKeyLen. The zero
// value is ready; safe for concurrent use.
type keyPool struct{ p sync.Pool }

// get returns an empty buffer; hand it back with put.
func (kp *keyPool) get() *[]byte {
	if b, ok := kp.p.Get().(*[]byte); ok {
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, 2*lookupKeyLen)
	return &b
}

// put returns a buffer; key is what was built in it (its capacity may
// have grown).
func (kp *keyPool) put(b *[]byte, key []byte) {
	*b = key
	kp.p.Put(b)
}
