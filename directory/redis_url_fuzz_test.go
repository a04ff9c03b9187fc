package directory_test

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/pinboard-go/pinboard/directory"
)

// FuzzParseRedisURL_RSRV3 checks REDIS_URL parsing: an error wraps ErrInvalidURL,
// is one line and never repeats the password; accepted options have at
// least one host:port address with a port in 1..65535, one address unless
// clustered or sentinel, a non-negative database, a master name for a
// sentinel, and TLS exactly for the rediss schemes.
func FuzzParseRedisURL_RSRV3(f *testing.F) {
	for _, s := range []string{
		"redis://127.0.0.1:6380", "redis://h", "redis://:p%40ss@h:1/3", "redis://u:p@h?db=2&client_name=pb",
		"rediss://h:6380", "rediss://h:6380?skip_verify=true", "redis+cluster://a:7000,b:7001,[::1]:7002",
		"rediss+cluster://a:7000", "redis+sentinel://s1,s2:5000/mymaster?db=1", "redis://a:1,b:2", "redis://h:0",
		"redis://h:99999", "redis://h/x", "redis+cluster://a:1/2", "redis+sentinel://a:1", "redis://h?skip_verify=1",
		"redis://h?nope=1", "http://h", "h:6379", "redis://", "redis://u:topsecret@h:bad",
		"rediss+sentinel://u:pw@[::1]/m?sentinel_username=s&sentinel_password=sp",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		o, err := directory.ParseRedisURL(raw)
		_, pass, hasPass := passwordOf(raw)
		if err != nil {
			msg := err.Error()
			if !errors.Is(err, directory.ErrInvalidURL) || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("unexpected error for %q; got %q; want one line wrapping ErrInvalidURL", raw, msg)
			}
			if hasPass && len(pass) >= 4 && strings.Contains(msg, pass) && !strings.Contains(strings.Replace(raw, pass, "", 1), pass) {
				t.Fatalf("unexpected password in the error for %q: %q", raw, msg)
			}
			return
		}
		if len(o.InitAddress) == 0 {
			t.Fatalf("unexpected acceptance of %q without an address", raw)
		}
		scheme, _, _ := strings.Cut(raw, "://")
		if len(o.InitAddress) > 1 && !strings.Contains(scheme, "+") {
			t.Fatalf("unexpected acceptance of several hosts in %q", raw)
		}
		for _, a := range o.InitAddress {
			h, p, err := net.SplitHostPort(a)
			n, perr := strconv.Atoi(p)
			if err != nil || h == "" || perr != nil || n < 1 || n > 65535 {
				t.Fatalf("unexpected address %q from %q", a, raw)
			}
		}
		if o.SelectDB < 0 {
			t.Fatalf("unexpected database %d from %q", o.SelectDB, raw)
		}
		if strings.HasSuffix(scheme, "+sentinel") && o.Sentinel.MasterSet == "" {
			t.Fatalf("unexpected sentinel without a master name from %q", raw)
		}
		if (o.TLSConfig != nil) != strings.HasPrefix(scheme, "rediss") {
			t.Fatalf("unexpected TLS %v for %q", o.TLSConfig != nil, raw)
		}
	})
}

// passwordOf returns the raw userinfo password of a URL, if any.
func passwordOf(raw string) (string, string, bool) {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "", "", false
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	i := strings.LastIndexByte(rest, '@')
	if i < 0 {
		return "", "", false
	}
	user, pass, has := strings.Cut(rest[:i], ":")
	return user, pass, has
}

// FuzzRedisURLPassword_RSRV3 builds REDIS_URL from its parts, the password
// written as an operator would paste it, and checks that no error repeats
// the password, whatever bytes it holds ("Errors never repeat the
// password"): percent-encoding it is the operator's job, keeping it out
// of logs is ours.
func FuzzRedisURLPassword_RSRV3(f *testing.F) {
	f.Add("redis", "u", "topsecret", "h:bad", "/0")
	f.Add("redis", "", "p%40ss", "h:1", "/3")
	f.Add("redis", "u", "pa/ssword", "h:6379", "")
	f.Add("redis+sentinel", "u", "pass?word", "s1,s2:5000", "/mymaster")
	f.Add("rediss", "u", "pass#word", "h", "?skip_verify=1")
	f.Add("redis+sentinel", "u", "hunter22", "s1", "/m?sentinel_password=sentinelsecret&typo=1")
	f.Fuzz(func(t *testing.T, scheme, user, pass, hosts, tail string) {
		if len(pass) < 6 || strings.Contains(scheme+user+hosts+tail, pass) || strings.ContainsAny(user, ":/?@") {
			return
		}
		raw := scheme + "://" + user + ":" + pass + "@" + hosts + tail
		_, err := directory.ParseRedisURL(raw)
		if err == nil {
			return
		}
		// Each half of the password too: a split at "/" or "?" must not
		// leak its first part into a host or path message. What the rest
		// of the URL or the messages' own words spell, quoted, is no leak.
		msg := err.Error()
		others := strconv.Quote(scheme+"://"+user+":xxxxx@"+hosts+tail) + strconv.Quote(hosts) + strconv.Quote(tail) +
			strconv.Quote(scheme) + strconv.Quote(user) + ` invalid redis url an @ follows the host: percent-encode /, ?, # and @ in the user name, password and parameters (%2F, %3F, %23, %40) ` +
			`unknown scheme parameter bad port in host empty database is not a number db= is not allowed here skip_verify needs rediss several hosts need redis+cluster:// or redis+sentinel:// ` +
			`needs one master name as its path a cluster has no database number cannot parse credentials, path or query missing scheme ` +
			`a + in the query reads as a space: percent-encode it (%2B, a space %20) ` +
			`cannot decode the query: percent-encode %, ; and + in parameters (%25, %3B, %2B) client_name may hold only printable ASCII without spaces`
		// A sentinel_password is a parameter: in the query, after "?",
		// "&" or ";". Elsewhere ("h" + "sentinel_password=x" is a host)
		// it is no password, and the message may show it.
		_, query, _ := strings.Cut(raw, "?")
		if i := strings.Index(query, "sentinel_password="); i >= 0 && (i == 0 || strings.IndexByte("?&;", query[i-1]) >= 0) {
			sp, _, _ := strings.Cut(query[i+len("sentinel_password="):], "&")
			if len(sp) >= 6 && strings.Count(raw, sp) == 1 && strings.Contains(msg, sp) {
				t.Fatalf("unexpected sentinel password %q in the error for %q: %q", sp, raw, err)
			}
		}
		for _, p := range []string{pass, pass[:len(pass)/2], pass[len(pass)/2:]} {
			if len(p) >= 3 && !strings.Contains(others, p) && strings.Contains(msg, p) {
				t.Fatalf("unexpected password part %q in the error for %q: %q", p, raw, err)
			}
		}
	})
}
