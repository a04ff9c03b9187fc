package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	ctlOnce sync.Once
	ctlPath string
	ctlErr  error
)

// pinboardctlBinary builds ./cmd/pinboardctl once per test run.
func pinboardctlBinary() (string, error) {
	ctlOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			ctlErr = err
			return
		}
		bin := filepath.Join(runDir, "pinboardctl")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/pinboardctl")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			ctlErr = fmt.Errorf("cannot build ./cmd/pinboardctl: %w\n%s", err, out)
			return
		}
		ctlPath = bin
	})
	return ctlPath, ctlErr
}

type ctlResult struct {
	code           int
	stdout, stderr string
}

func (r ctlResult) String() string {
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
}

// ctl runs pinboardctl with PINBOARD_URL and PINBOARD_TOKEN.
func ctl(t *testing.T, url, token string, args ...string) ctlResult {
	t.Helper()
	bin, err := pinboardctlBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(scrubbedEnv(), "PINBOARD_URL="+url, "PINBOARD_TOKEN="+token)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	r := ctlResult{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("cannot run pinboardctl %v: %v", args, err)
	}
	return r
}

// ctlPassport is the e2e passport plus two narrower keys: a worker-only
// token and an operator whose claims cover /tickers only.
func ctlPassport() string {
	p := map[string]any{
		"providers": []any{map[string]any{
			"type": "staticToken",
			"id":   "pinboard",
			"keys": []any{
				map[string]any{
					"name": "e2e", "token": map[string]any{"env": "PINBOARD_TOKEN"},
					"scopes": []string{"pinboard:worker", "pinboard:operator"},
					"claims": map[string]any{"pinboard": map[string]any{"namespaces": []string{"*"}, "allowedBackendHosts": []string{"127.0.0.1"}}},
				},
				map[string]any{
					"name": "worker-only", "token": map[string]any{"env": "CTL_WORKER_TOKEN"},
					"scopes": []string{"pinboard:worker"},
					"claims": map[string]any{"pinboard": map[string]any{"namespaces": []string{"*"}, "allowedBackendHosts": []string{"127.0.0.1"}}},
				},
				map[string]any{
					"name": "tickers-operator", "token": map[string]any{"env": "CTL_TICKERS_TOKEN"},
					"scopes": []string{"pinboard:operator"},
					"claims": map[string]any{"pinboard": map[string]any{"namespaces": []string{"/tickers"}}},
				},
			},
		}},
		"namespaces": map[string]any{"*": map[string]any{"allow": "anonymous"}},
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic("BUG: " + err.Error())
	}
	return string(b)
}

// TestPinboardctl runs every command against a live fleet, and the error
// paths: 401, 403, unreachable, unknown clientId, no placement, usage.
func TestPinboardctl(t *testing.T) {
	requireSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	workerToken, tickersToken := randomHex(24), randomHex(24)
	f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1"}, Headroom: 8, PinboardEnv: []string{
		"PINBOARD_PASSPORT=" + ctlPassport(),
		"CTL_WORKER_TOKEN=" + workerToken,
		"CTL_TICKERS_TOKEN=" + tickersToken,
	}})
	url, token := f.Pinboard.URL, f.Pinboard.Token
	w1 := f.Records["w1"]

	expect := func(r ctlResult, code int, out, errOut string) {
		t.Helper()
		if r.code != code || !strings.Contains(r.stdout, out) || !strings.Contains(r.stderr, errOut) {
			t.Errorf("unexpected pinboardctl result; got %s\nwant exit %d, stdout with %q, stderr with %q", r, code, out, errOut)
		}
	}

	t.Run("workers", func(t *testing.T) {
		r := ctl(t, url, token, "workers")
		expect(r, 0, w1.ClientID, "")
		expect(r, 0, "healthy", "")
		expect(r, 0, w1.AdvertiseURL, "")
		r = ctl(t, url, token, "workers", "--json")
		var body struct {
			Workers []WorkerRecord `json:"workers"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &body); err != nil || len(body.Workers) != 1 || body.Workers[0].ClientID != w1.ClientID {
			t.Errorf("unexpected workers --json: %s (%v)", r, err)
		}
	})
	t.Run("health", func(t *testing.T) {
		expect(ctl(t, url, token, "health"), 0, "ok: store=memory workers=1", "")
		r := ctl(t, url, token, "health", "--json")
		var h Health
		if err := json.Unmarshal([]byte(r.stdout), &h); err != nil || !h.OK {
			t.Errorf("unexpected health --json: %s (%v)", r, err)
		}
	})
	t.Run("drain and undrain", func(t *testing.T) {
		expect(ctl(t, url, token, "drain", w1.ClientID, "--deadline", "5m"), 0, "released in 5m0s", "")
		expect(ctl(t, url, token, "workers"), 0, "draining (operator)", "")
		// A drained worker takes no new placements.
		r, err := do(ctx, http.MethodGet, url+"/counters/ctl-new/value", nil, nil)
		if err != nil || r.Status != http.StatusServiceUnavailable {
			t.Errorf("unexpected placement on a drained fleet; got %s %v; want 503", r, err)
		}
		expect(ctl(t, url, token, "undrain", w1.ClientID), 0, "undrained "+w1.ClientID, "")
		expect(ctl(t, url, token, "workers"), 0, "healthy", "")
		expect(ctl(t, url, token, "drain", "no-such-client"), 1, "", "unknown clientId")
		expect(ctl(t, url, token, "undrain", "no-such-client"), 1, "", `no live worker has clientId "no-such-client"`)
	})
	t.Run("where and wind-down", func(t *testing.T) {
		if _, r, err := whoami(ctx, f.Pinboard, "ctl1"); err != nil {
			t.Fatalf("%v (%s)", err, r)
		}
		expect(ctl(t, url, token, "where", "counters", "ctl1"), 0, "/counters/ctl1 -> "+w1.ClientID+" at "+w1.AdvertiseURL, "")
		r := ctl(t, url, token, "where", "/counters", "ctl1", "--json")
		if !strings.Contains(r.stdout, `"live":true`) {
			t.Errorf("unexpected where --json: %s", r)
		}
		expect(ctl(t, url, token, "where", "counters", "never-placed"), 1, "", "nothing owns /counters/never-placed")
		expect(ctl(t, url, token, "wind-down", "counters", "ctl1", "--deadline", "30s"), 0, "wind-down within 30s", "")
		expect(ctl(t, url, token, "wind-down", "counters", "ctl1", "--revoke"), 0, "wind-down revoked", "")
		expect(ctl(t, url, token, "wind-down", "counters", "never-placed", "--revoke"), 1, "", "404 no placement")
		expect(ctl(t, url, token, "wind-down", "counters", "ctl1"), 2, "", "exactly one of --deadline D or --revoke")
	})
	t.Run("401", func(t *testing.T) {
		expect(ctl(t, url, "not-a-token", "workers"), 4, "", "401 unauthorized")
	})
	t.Run("403", func(t *testing.T) {
		expect(ctl(t, url, workerToken, "workers"), 4, "", "403 forbidden")
		// An operator whose claims do not cover the worker's namespaces.
		expect(ctl(t, url, tickersToken, "drain", w1.ClientID), 4, "", "403 forbidden")
		expect(ctl(t, url, tickersToken, "where", "counters", "ctl1"), 4, "", "403 forbidden")
	})
	t.Run("unreachable", func(t *testing.T) {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		expect(ctl(t, "http://127.0.0.1:"+strconv.Itoa(port), token, "health"), 3, "", "cannot reach pinboard")
	})
}
