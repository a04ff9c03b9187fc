package attest

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// These tests talk to the reference worker itself and run only when
// PINBOARD_REF_PYTHON names a Python with `pinned` installed, e.g.
//
//	PINBOARD_REF_PYTHON=/tmp/pv/bin/python go test ./attest/
//
// Everything else in this package runs from testdata/vectors.json.

func refPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("PINBOARD_REF_PYTHON")
	if py == "" {
		t.Skip("PINBOARD_REF_PYTHON not set")
	}
	return py
}

// TestReferenceVectorsUpToDate_RTR5 regenerates the vectors and requires
// the stored file to match, so a pinned upgrade cannot silently drift.
func TestReferenceVectorsUpToDate_RTR5(t *testing.T) {
	py := refPython(t)
	out, err := exec.Command(py, "../tools/attestvectors.py").Output()
	if err != nil {
		t.Fatalf("cannot run tools/attestvectors.py: %v", err)
	}
	stored, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatalf("cannot read vectors: %v", err)
	}
	if !bytes.Equal(out, stored) {
		t.Fatalf("testdata/vectors.json is stale; regenerate it with tools/attestvectors.py")
	}
}

const refVerifyScript = `
import importlib, json, sys
ref = importlib.import_module("pinned.pinboard.attestation")
out = []
for c in json.load(sys.stdin):
    try:
        ok = ref.verify_attestation(c["token"], secret=c["secret"], audiences=set(c["audiences"]), now=c["now"]) is not None
        out.append("accept" if ok else "reject")
    except Exception:
        out.append("raise")
json.dump(out, sys.stdout)
`

// TestReferenceAcceptsGoMinted_RTR5 mints random attestations in Go,
// including acct objects from a passport and non-ASCII strings, and
// requires the reference verifier to accept every one; random one-byte
// mutations of them must get the same verdict from both verifiers.
func TestReferenceAcceptsGoMinted_RTR5(t *testing.T) {
	py := refPython(t)
	rng := rand.New(rand.NewPCG(3, 4))
	av := vectors(t).Acct[0]
	p, err := ParsePassport([]byte(av.Passport), testEnv(av.Env))
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	randText := func(n int) string {
		const alphabet = "abcXYZ019/-_.\"\\ \n\té✓😀\u007f"
		runes := []rune(alphabet)
		var b strings.Builder
		for range n {
			b.WriteRune(runes[rng.IntN(len(runes))])
		}
		return b.String()
	}
	type refCase struct {
		Token     string   `json:"token"`
		Secret    string   `json:"secret"`
		Audiences []string `json:"audiences"`
		Now       float64  `json:"now"`
	}
	var cases []refCase
	var minted []bool // true: as minted; false: mutated
	var window []bool // for minted cases: now within [iat-30, exp+30]
	for i := range 300 {
		in := AttestationInput{
			Secret:   []byte(randText(1 + rng.IntN(90))),
			Aud:      randText(rng.IntN(40)),
			IssuedAt: 1_600_000_000 + rng.Int64N(400_000_000),
			Depth:    rng.IntN(5) - 1,
		}
		if rng.IntN(2) == 0 {
			in.Caller = randText(rng.IntN(30))
		}
		if prs := p.Principals(); rng.IntN(2) == 0 {
			in.Acct = prs[rng.IntN(len(prs))].AcctJSON
		}
		tok := string(AppendAttestation(nil, &in))
		now := float64(in.IssuedAt) + float64(rng.IntN(120)-45) + 0.5
		cases = append(cases, refCase{tok, string(in.Secret), []string{"other", in.Aud}, now})
		minted = append(minted, true)
		window = append(window, now >= float64(in.IssuedAt-30) && now <= float64(in.IssuedAt+60))
		if i%2 == 0 {
			b := []byte(tok)
			b[rng.IntN(len(b))] = "A-_=.+/!é"[rng.IntN(9)]
			cases = append(cases, refCase{string(b), string(in.Secret), []string{in.Aud}, now})
			minted = append(minted, false)
			window = append(window, false)
		}
	}
	stdin, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", refVerifyScript)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cannot run the reference verifier: %v", err)
	}
	var verdicts []string
	if err := json.Unmarshal(out, &verdicts); err != nil || len(verdicts) != len(cases) {
		t.Fatalf("unexpected reference output %q: %v", out, err)
	}
	accepted := 0
	for i, c := range cases {
		_, goErr := VerifyAttestation(c.Token, []byte(c.Secret), c.Audiences, pyTime(c.Now))
		refOK := verdicts[i] == "accept"
		if refOK {
			accepted++
		}
		if minted[i] && refOK != window[i] {
			t.Errorf("case %d: reference says %s for a Go-minted token (in window: %v): %s", i, verdicts[i], window[i], c.Token)
		}
		if (goErr == nil) != refOK {
			t.Errorf("case %d (minted %v): Go verdict %v, reference %s for %s", i, minted[i], goErr, verdicts[i], c.Token)
		}
	}
	t.Logf("%d tokens, %d accepted by the reference", len(cases), accepted)
}
