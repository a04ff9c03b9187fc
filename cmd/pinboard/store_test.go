package main

import (
	"bytes"
	"strings"
	"testing"
)

// A malformed REDIS_URL is a configuration error: one line naming the
// variable, exit 2, nothing started (R-SRV-3). The password never shows.
func TestMalformedRedisURL_RSRV3(t *testing.T) {
	for _, u := range []string{
		"redis://:s3cret@127.0.0.1:notaport",
		"redis://127.0.0.1:6379/notadb",
		"redis://a:1,b:2",
		"redis+sentinel://127.0.0.1:26379",
		"redis+cluster://127.0.0.1:7000/3",
		"redis://127.0.0.1:6379?bogus=1",
		"ftp://127.0.0.1",
	} {
		env := map[string]string{
			"PINBOARD_PASSPORT": `{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"TOK"},"scopes":["pinboard:worker"]}]}]}`,
			"TOK":               "t",
			"REDIS_URL":         u,
		}
		var stderr bytes.Buffer
		code := run(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &stderr)
		out := stderr.String()
		if code != 2 {
			t.Errorf("%s: unexpected exit code; got %d; want 2 (%s)", u, code, out)
		}
		if !strings.HasPrefix(out, "pinboard: REDIS_URL: ") || strings.Count(out, "\n") != 1 {
			t.Errorf("%s: unexpected message; got %q; want one line naming REDIS_URL", u, out)
		}
		if strings.Contains(out, "s3cret") {
			t.Errorf("%s: unexpected password in %q", u, out)
		}
	}
}
