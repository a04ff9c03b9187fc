package directory_test

import (
	"errors"
	"testing"

	"github.com/pinboard-go/pinboard/directory"
)

// An unencoded "#" past the user info starts a URL fragment: net/url drops
// it and everything after it, so a sentinel_password holding one was cut
// short without a word (an authentication failure at run time instead of
// a configuration error), and a host or database came out wrong. It is
// refused like a "/", "?" or "#" in the password (R-SRV-3).
func TestParseRedisURLRefusesFragment_RSRV3(t *testing.T) {
	for _, raw := range []string{
		"redis+sentinel://s:26379/m?sentinel_password=se#cret",
		"redis://h:6379/2?client_name=a#b",
		"redis://h/2#x",
		"redis://h#x",
		"rediss+cluster://a:1,b:2#x",
	} {
		o, err := directory.ParseRedisURL(raw)
		if !errors.Is(err, directory.ErrInvalidURL) {
			t.Errorf("unexpected result for %q; got %v (sentinel password %q, addresses %v, db %d); want ErrInvalidURL",
				raw, err, o.Sentinel.Password, o.InitAddress, o.SelectDB)
		}
	}
	o, err := directory.ParseRedisURL("redis+sentinel://u:p%23w@s/m?sentinel_password=se%23cret")
	if err != nil || o.Password != "p#w" || o.Sentinel.Password != "se#cret" {
		t.Fatalf("unexpected passwords; got %q, %q, %v; want %q, %q", o.Password, o.Sentinel.Password, err, "p#w", "se#cret")
	}
}

// skip_verify's value is read, not guessed: yes, on or a typo verified the
// certificate the operator asked not to, without a word. A value other
// than true, 1, false or 0 (or none) is refused (R-SRV-3).
func TestParseRedisURLSkipVerifyValues_RSRV3(t *testing.T) {
	for raw, want := range map[string]bool{
		"rediss://h":                          false,
		"rediss://h?skip_verify":              true,
		"rediss://h?skip_verify=":             true,
		"rediss://h?skip_verify=1":            true,
		"rediss://h?skip_verify=true":         true,
		"rediss://h?skip_verify=0":            false,
		"rediss://h?skip_verify=false":        false,
		"rediss+sentinel://s/m?skip_verify=1": true,
	} {
		o, err := directory.ParseRedisURL(raw)
		if err != nil || o.TLSConfig == nil || o.TLSConfig.InsecureSkipVerify != want {
			t.Errorf("unexpected TLS options for %q; got %+v, %v; want InsecureSkipVerify %v", raw, o.TLSConfig, err, want)
		}
	}
	for _, raw := range []string{"rediss://h?skip_verify=yes", "rediss://h?skip_verify=on", "rediss://h?skip_verify=ture"} {
		if _, err := directory.ParseRedisURL(raw); !errors.Is(err, directory.ErrInvalidURL) {
			t.Errorf("unexpected result for %q; got %v; want ErrInvalidURL", raw, err)
		}
	}
}
