package attest

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"math/rand/v2"
	"testing"
)

func TestMacer_MatchesCryptoHMAC_RTR5(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m := getMacer()
	defer putMacer(m)
	for _, keyLen := range []int{0, 1, 32, 63, 64, 65, 100, 200} {
		for _, msgLen := range []int{0, 1, 55, 56, 64, 200, 1000} {
			key, msg := make([]byte, keyLen), make([]byte, msgLen)
			for i := range key {
				key[i] = byte(rng.Uint32())
			}
			for i := range msg {
				msg[i] = byte(rng.Uint32())
			}
			want := hmac.New(sha256.New, key)
			want.Write(msg)
			if got := m.mac(key, msg); !bytes.Equal(got[:], want.Sum(nil)) {
				t.Fatalf("unexpected HMAC for key %d bytes, msg %d bytes; got %x; want %x", keyLen, msgLen, got[:], want.Sum(nil))
			}
		}
	}
}
