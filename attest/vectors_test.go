package attest

import (
	"encoding/json"
	"math"
	"os"
	"sync"
	"testing"
	"time"
)

// referenceVectors mirrors testdata/vectors.json, which tools/attestvectors.py
// generates from the reference worker (pinned) so these tests need no Python:
//
//	/tmp/pv/bin/python tools/attestvectors.py > attest/testdata/vectors.json
type referenceVectors struct {
	Pinned string `json:"pinned"`
	TTL    int64  `json:"ttl"`
	Skew   int64  `json:"skew"`
	Mint   []struct {
		Name   string  `json:"name"`
		Secret string  `json:"secret"`
		Aud    string  `json:"aud"`
		IAT    int64   `json:"iat"`
		Caller *string `json:"caller"`
		Depth  *int    `json:"depth"`
		Acct   *string `json:"acct"`
		Token  string  `json:"token"`
	} `json:"mint"`
	Verify []struct {
		Name      string   `json:"name"`
		Token     string   `json:"token"`
		Secret    string   `json:"secret"`
		Audiences []string `json:"audiences"`
		Now       float64  `json:"now"`
		Result    string   `json:"result"` // accept, reject, raise
		Raises    string   `json:"raises"`
		Expect    *struct {
			Aud    string  `json:"aud"`
			IAT    string  `json:"iat"`
			Exp    string  `json:"exp"`
			Caller *string `json:"caller"`
			Depth  *string `json:"depth"`
			Acct   *struct {
				Sub    string   `json:"sub"`
				Scopes []string `json:"scopes"`
			} `json:"acct"`
		} `json:"expect"`
	} `json:"verify"`
	Acct []struct {
		Passport string            `json:"passport"`
		Env      map[string]string `json:"env"`
		Secret   string            `json:"secret"`
		Aud      string            `json:"aud"`
		IAT      int64             `json:"iat"`
		Keys     []struct {
			Sub      string `json:"sub"`
			AcctJSON string `json:"acctJson"`
			Token    string `json:"token"`
		} `json:"keys"`
	} `json:"acct"`
	Base64 []struct {
		Segment string  `json:"segment"`
		Hex     *string `json:"hex"`
	} `json:"base64"`
	JSON []struct {
		B64  []byte  `json:"b64"`
		Type *string `json:"type"`
	} `json:"json"`
}

var loadVectors = sync.OnceValues(func() (*referenceVectors, error) {
	raw, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		return nil, err
	}
	var v referenceVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return &v, nil
})

func vectors(t testing.TB) *referenceVectors {
	t.Helper()
	v, err := loadVectors()
	if err != nil {
		t.Fatalf("cannot load reference vectors: %v", err)
	}
	return v
}

// pyTime converts the reference's float clock to a time.Time.
func pyTime(f float64) time.Time {
	sec := math.Floor(f)
	nsec := math.Round((f - sec) * 1e9)
	if nsec >= 1e9 {
		sec++
		nsec -= 1e9
	}
	return time.Unix(int64(sec), int64(nsec))
}
