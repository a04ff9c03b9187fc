package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// accountPassport is the deployment key plus a client key, "reader", with
// a scope and a claim of its own, and /counters open to authenticated
// clients holding app:read only.
const accountPassport = `{"providers":[{"type":"staticToken","id":"pinboard","keys":[
 {"name":"deployment","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker","pinboard:operator"],
  "claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}},
 {"name":"reader","token":{"env":"READER_TOKEN"},"scopes":["app:read"],
  "claims":{"pinboard":{"namespaces":["/counters"]},"tenant":"t-42"}}]}],
 "namespaces":{"/counters":{"allow":"authenticated","scopes":["app:read"]},"*":{"allow":"anonymous"}}}`

// An authenticated client's request through pinboard to the real worker
// (R-TR-4, R-TR-5): pinboard consumes the passport credential and the
// worker's pinned verifies the attestation's "acct" and hands the
// application Attestation.Account(sub, claims, scopes) — the key's
// "<provider>:<key>", its scopes and its whole claims object. No other
// test runs the real worker behind an authenticated namespace: the
// attestation vectors (attest/testdata) check the token alone.
func TestAuthenticatedAccountRealWorker_RTR4_RTR5(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const reader = "reader-token-8c1f"
	pb := StartPinboard(t, PinboardOptions{Passport: accountPassport, Env: []string{"READER_TOKEN=" + reader}})
	w := StartWorker(t, pb, WorkerOptions{Name: "w1", Headroom: 100})
	if _, err := w.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	// /tickers is anonymous: through the cold start with it.
	if _, err := getWithRetry(ctx, pb.URL+"/tickers/warm/whoami"); err != nil {
		t.Fatal(err)
	}
	if r, err := do(ctx, http.MethodGet, pb.URL+"/counters/acct/caller", nil, nil); err != nil || r.Status != http.StatusUnauthorized {
		t.Fatalf("unexpected answer without a credential; got %s (err %v); want 401", r, err)
	}
	auth := http.Header{"Authorization": {"Bearer " + reader}}
	r, err := do(ctx, http.MethodGet, pb.URL+"/counters/acct/caller", auth, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected answer with the reader's credential; got %s (err %v); want 200", r, err)
	}
	var got struct {
		Caller  *string `json:"caller"`
		Account *struct {
			Sub    string                     `json:"sub"`
			Scopes []string                   `json:"scopes"`
			Claims map[string]json.RawMessage `json:"claims"`
		} `json:"account"`
	}
	if err := r.JSON(&got); err != nil {
		t.Fatal(err)
	}
	if got.Caller != nil || got.Account == nil || got.Account.Sub != "pinboard:reader" || !slices.Equal(got.Account.Scopes, []string{"app:read"}) ||
		string(got.Account.Claims["tenant"]) != `"t-42"` || !strings.Contains(string(got.Account.Claims["pinboard"]), `"/counters"`) {
		t.Fatalf("unexpected attested caller; got %s; want the account pinboard:reader with scope app:read and the key's claims (tenant t-42)", r.Body)
	}
	// The credential itself is consumed: the worker never sees it.
	r, err = do(ctx, http.MethodGet, pb.URL+"/counters/acct/headers", auth, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot list the headers the worker got: %s (err %v)", r, err)
	}
	if strings.Contains(strings.ToLower(string(r.Body)), `"authorization"`) || strings.Contains(string(r.Body), reader) {
		t.Fatalf("unexpected header at the worker: the passport credential was forwarded: %s", r.Body)
	}
}
