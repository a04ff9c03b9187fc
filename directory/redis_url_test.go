package directory_test

import (
	"errors"
	"strings"
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

// A query net/url cannot decode — a "%" not followed by two hex digits, a
// ";" — was dropped pair by pair without a word (url.URL.Query ignores the
// error): "?db=2;" opened database 0, a sentinel_password holding "%" or
// ";" was sent empty, and a misspelt parameter with a bad escape was never
// refused. A literal "+" was read as a space (form encoding), so a
// sentinel_password holding one failed authentication at run time. Both
// are refused at start-up instead, like an unencoded "#" (R-SRV-3).
func TestParseRedisURLRefusesUndecodableQuery_RSRV3(t *testing.T) {
	for _, raw := range []string{
		"redis://h?db=2;",
		"redis://h?db=2%",
		"redis://h/3?db=2%zz",
		"redis://h?typo%zz=1",
		"redis+sentinel://s/m?sentinel_password=pa%ss",
		"redis+sentinel://s/m?sentinel_password=a;b",
		"redis+sentinel://s/m?sentinel_password=a+b",
		"redis://h?client_name=a;b&db=1",
	} {
		o, err := directory.ParseRedisURL(raw)
		if !errors.Is(err, directory.ErrInvalidURL) {
			t.Errorf("unexpected result for %q; got %v (db %d, sentinel password %q, client name %q); want ErrInvalidURL",
				raw, err, o.SelectDB, o.Sentinel.Password, o.ClientName)
		}
	}
	o, err := directory.ParseRedisURL("redis+sentinel://s/m?sentinel_password=a%2Bb%3Bc%25d%20e&db=2")
	if err != nil || o.Sentinel.Password != "a+b;c%d e" || o.SelectDB != 2 {
		t.Fatalf("unexpected options; got sentinel password %q, db %d, %v; want %q, 2", o.Sentinel.Password, o.SelectDB, err, "a+b;c%d e")
	}
}

// Redis refuses a client name holding a space, a line break or any byte
// outside '!'..'~' (CLIENT SETNAME), so every connection failed and
// pinboard exited as if Redis were unreachable (exit 1, restarted for
// ever) instead of naming the bad REDIS_URL (exit 2, R-SRV-3).
func TestParseRedisURLRefusesBadClientName_RSRV3(t *testing.T) {
	for _, raw := range []string{"redis://h?client_name=a%20b", "redis://h?client_name=a%0Ab", "redis://h?client_name=%C3%A9"} {
		if o, err := directory.ParseRedisURL(raw); !errors.Is(err, directory.ErrInvalidURL) {
			t.Errorf("unexpected result for %q; got %v (client name %q); want ErrInvalidURL", raw, err, o.ClientName)
		}
	}
	if o, err := directory.ParseRedisURL("redis://h?client_name=pinboard-1_a.b"); err != nil || o.ClientName != "pinboard-1_a.b" {
		t.Fatalf("unexpected options; got client name %q, %v; want %q", o.ClientName, err, "pinboard-1_a.b")
	}
}

// A host holding colons that is no IPv6 address ("h:6379:6380", a port
// typed twice) was taken for a bare IPv6 address and dialled as
// "[h:6379:6380]:6379": an unreachable Redis (exit 1) instead of a
// configuration error (R-SRV-3).
func TestParseRedisURLRefusesColonHost_RSRV3(t *testing.T) {
	for _, raw := range []string{"redis://h:6379:6380", "redis+cluster://a:1,b:2:3", "redis://[h:1]:7000"} {
		if o, err := directory.ParseRedisURL(raw); !errors.Is(err, directory.ErrInvalidURL) {
			t.Errorf("unexpected result for %q; got %v (addresses %v); want ErrInvalidURL", raw, err, o.InitAddress)
		}
	}
	for raw, want := range map[string]string{"redis://::1": "[::1]:6379", "redis://[::1]": "[::1]:6379", "redis://[fe80::1]:7000": "[fe80::1]:7000"} {
		if o, err := directory.ParseRedisURL(raw); err != nil || len(o.InitAddress) != 1 || o.InitAddress[0] != want {
			t.Errorf("unexpected addresses for %q; got %v, %v; want %s", raw, o.InitAddress, err, want)
		}
	}
}

// The query is decoded before its parameters are read, so
// "sentinel%5Fpassword=…" sets the sentinel password like
// "sentinel_password=…" — and error messages, which hide the value of the
// latter, printed the former's (R-SRV-3: errors never repeat a password).
func TestParseRedisURLRedactsEncodedSentinelPassword_RSRV3(t *testing.T) {
	for _, raw := range []string{
		"redis+sentinel://s/m?sentinel%5Fpassword=topsecret&db=x",
		"redis+sentinel://s/m?sentinel%5fpassword=topsecret&db=x",
		"redis+sentinel://s/m?%73entinel_password=topsecret&db=x",
	} {
		_, err := directory.ParseRedisURL(raw)
		if !errors.Is(err, directory.ErrInvalidURL) || strings.Contains(err.Error(), "topsecret") {
			t.Errorf("unexpected error for %q; got %v; want ErrInvalidURL without the sentinel password", raw, err)
		}
	}
	if o, err := directory.ParseRedisURL("redis+sentinel://s/m?sentinel%5Fpassword=topsecret"); err != nil || o.Sentinel.Password != "topsecret" {
		t.Fatalf("unexpected sentinel password; got %q, %v; want %q", o.Sentinel.Password, err, "topsecret")
	}
}

// A ";" in the query is refused, with a message that shows the URL: a
// sentinel_password after it ("x=1;sentinel_password=…") was printed as
// part of the value of the parameter before it (R-SRV-3).
func TestParseRedisURLRedactsAfterSemicolon_RSRV3(t *testing.T) {
	_, err := directory.ParseRedisURL("redis+sentinel://s/m?x=1;sentinel_password=topsecret")
	if !errors.Is(err, directory.ErrInvalidURL) || strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("unexpected error; got %v; want ErrInvalidURL without the sentinel password", err)
	}
}

// Brackets enclose an IPv6 address and nothing else (RFC 3986 §3.2.2):
// "redis://[::1" (the closing bracket lost) was dialled as [::1]:6379 and
// "redis://[h]:7000" as h:7000, where the Node pinboard's URL parser
// refuses both; a malformed REDIS_URL is a configuration error (R-SRV-3).
func TestParseRedisURLRefusesStrayBrackets_RSRV3(t *testing.T) {
	for _, raw := range []string{"redis://[::1", "redis://::1]", "redis://h]", "redis://[h]", "redis://[h]:7000", "redis://[10.0.0.1]:7000", "redis+cluster://[::1]:7000,[::2"} {
		if o, err := directory.ParseRedisURL(raw); !errors.Is(err, directory.ErrInvalidURL) {
			t.Errorf("unexpected result for %q; got %v (addresses %v); want ErrInvalidURL", raw, err, o.InitAddress)
		}
	}
}
