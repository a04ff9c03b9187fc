package registry

import (
	"net/url"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzProbeTarget_RTR3 checks that the challenge probe dials the host the
// claims approved (R-TR-3, R-REG-1): an advertiseUrl CheckBackend accepts
// is parsed by net/url there and in the proxy, but the prober hands it to
// fasthttp, so the two parsers must agree on its scheme and host, or a
// worker key limited to one host could have pinboard probe another.
func FuzzProbeTarget_RTR3(f *testing.F) {
	for _, s := range []string{
		"http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1/prefix/", "https://127.0.0.1",
		"http://127.0.0.1:8000?x=1", "http://u@127.0.0.1", "http://127.0.0.1.:80", "http://[::ffff:127.0.0.1]:80",
		"http://127.0.0.1:8000#f", "HTTP://127.0.0.1", "http://127.0.0.1:8000/a%2Fb", "http://127.0.0.1\\@evil",
		"http://127.0.0.1:80\\evil", "http:127.0.0.1", "http:/127.0.0.1/x",
	} {
		f.Add(s)
	}
	pr, err := testPassport(f).Authenticate([]byte("Bearer " + workerToken))
	if err != nil || pr == nil {
		f.Fatalf("cannot authenticate the worker key: %v", err)
	}
	f.Fuzz(func(t *testing.T, advertiseURL string) {
		if err := pr.Claims.CheckBackend(advertiseURL); err != nil {
			if msg := err.Error(); msg == "" || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("unexpected error for %q; got %q; want one line", advertiseURL, msg)
			}
			return
		}
		u, err := url.Parse(advertiseURL)
		if err != nil {
			t.Fatalf("unexpected acceptance of %q net/url refuses: %v", advertiseURL, err)
		}
		var req fasthttp.Request
		req.SetRequestURI(strings.TrimSuffix(advertiseURL, "/") + "/_pinned/challenge?challenge=c")
		uri := req.URI()
		host := strings.ToLower(u.Host)
		if string(uri.Scheme()) != strings.ToLower(u.Scheme) || strings.ToLower(string(uri.Host())) != host {
			t.Fatalf("unexpected probe target for %q; fasthttp %s://%s; net/url %s://%s", advertiseURL, uri.Scheme(), uri.Host(), u.Scheme, u.Host)
		}
		if !strings.HasSuffix(string(uri.Path()), "/_pinned/challenge") || string(uri.QueryArgs().Peek("challenge")) != "c" {
			t.Fatalf("unexpected probe path for %q; got %s?%s", advertiseURL, uri.Path(), uri.QueryString())
		}
	})
}
