package attest

import (
	"crypto/sha256"
	"hash"
	"sync"
)

// macer computes HMAC-SHA256 (RFC 2104 §2) with a key that may change on
// every call. crypto/hmac binds its key in hmac.New, which allocates, and
// pinboard signs for a different worker secret on nearly every forwarded
// request (R-TR-5), so a per-secret hmac would need a cache keyed by secret
// with its own eviction and locking. HMAC is two SHA-256 passes over padded
// key blocks; doing them on a pooled sha256 state costs two extra block
// compressions and no allocation. mac_test.go checks it against crypto/hmac.
//
// A macer is not safe for concurrent use; take one from macPool.
type macer struct {
	h     hash.Hash
	key   [sha256.BlockSize]byte // K0: the key, zero-padded, or its digest when longer than a block
	pad   [sha256.BlockSize]byte
	inner [sha256.Size]byte
	sum   [sha256.Size]byte
	// json is AppendAttestation's payload scratch; it lives here so one
	// pool Get serves the whole mint.
	json []byte
}

// macPool holds idle macers. It is a cache, not state: any macer serves any
// key.
var macPool = sync.Pool{New: func() any { return &macer{h: sha256.New()} }}

// maxPooledJSON keeps one huge acct from pinning memory in the pool.
const maxPooledJSON = 16 << 10

func getMacer() *macer { return macPool.Get().(*macer) }

func putMacer(m *macer) {
	if cap(m.json) > maxPooledJSON {
		m.json = nil
	}
	macPool.Put(m)
}

// mac returns HMAC-SHA256(key, msg) in m.sum; the result is valid until m's
// next use.
func (m *macer) mac(key, msg []byte) *[sha256.Size]byte {
	clear(m.key[:])
	if len(key) > sha256.BlockSize {
		m.h.Reset()
		m.h.Write(key)
		m.h.Sum(m.key[:0])
	} else {
		copy(m.key[:], key)
	}
	for i, k := range m.key {
		m.pad[i] = k ^ 0x36 // ipad
	}
	m.h.Reset()
	m.h.Write(m.pad[:])
	m.h.Write(msg)
	m.h.Sum(m.inner[:0])
	for i, k := range m.key {
		m.pad[i] = k ^ 0x5c // opad
	}
	m.h.Reset()
	m.h.Write(m.pad[:])
	m.h.Write(m.inner[:])
	m.h.Sum(m.sum[:0])
	return &m.sum
}
