package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Bad input is one line on stderr and exit code 2 (1 when the input is
// well formed but the target cannot be reached), never a run.
func TestBadInput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	t.Setenv("PINBOARD_TOKEN", "x")
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"load", "-bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"load", "-d", "5x"}, 2, `invalid value "5x" for flag -d`},
		{[]string{"load", "-rate", "-5"}, 2, "-rate -5: want > 0"},
		{[]string{"load", "-c", "-3"}, 2, "-c -3: want at least 1"},
		{[]string{"load", "-c", "0"}, 2, "-c 0: want at least 1"},
		{[]string{"load", "-d", "0"}, 2, "want a positive duration"},
		{[]string{"load", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"load", "-ids", "-1"}, 2, "-ids -1: want 0"},
		{[]string{"load", "-ids", "10"}, 2, `-ids 10: the -path "/bench/alice/json" has no {id}`},
		{[]string{"load", "-addr", closed, "-d", "1s"}, 1, "cannot reach -addr " + closed},
		{[]string{"run", "-timeout", "5x"}, 2, `invalid value "5x" for flag -timeout`},
		{[]string{"fleet", "-heartbeat", "5x"}, 2, `invalid value "5x" for flag -heartbeat`},
		{[]string{"report"}, 2, "-results is required"},
		{[]string{"relay"}, 2, "-upstream is required"},
		{[]string{"relay", "-upstream", "127.0.0.1:1", "-loops", "-1"}, 2, "-loops -1: want 0 or more"},
		{[]string{"relay", "-upstream", "127.0.0.1:1", "-mode", "threads"}, 1, `unknown mode "threads"`},
		{[]string{"relay", "-upstream", "127.0.0.1:1", "-listen", busy.Addr().String()}, 1, "address already in use"},
	}
	for _, tc := range cases {
		var stdout, stderr bytes.Buffer
		code := dispatch(tc.args, &stdout, &stderr)
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if code != tc.code || len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("%v: unexpected result; got %d, %q; want %d and one line with %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"load", "-h"}, {"run", "-h"}} {
		var stdout, stderr bytes.Buffer
		if code := dispatch(args, &stdout, &stderr); code != 0 || stdout.Len()+stderr.Len() == 0 {
			t.Errorf("%v: unexpected result; got %d, %q; want 0 and the usage", args, code, stdout.String()+stderr.String())
		}
	}
}

// -ids spreads a load over that many ids in turn, each where the path
// has {id}; without it every request has the path as it is.
func TestLoadIDs(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		mu.Unlock()
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-ids", "3", "-path", "/bench/{id}/json"}, []string{"/bench/h0/json", "/bench/h1/json", "/bench/h2/json"}},
		{[]string{"-path", "/bench/{id}/json"}, []string{"/bench/{id}/json"}},
	} {
		mu.Lock()
		clear(seen)
		mu.Unlock()
		var stdout, stderr bytes.Buffer
		args := append([]string{"load", "-addr", addr, "-c", "1", "-d", "300ms"}, tc.args...)
		if code := dispatch(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
		}
		mu.Lock()
		if len(seen) != len(tc.want) {
			t.Errorf("%v: unexpected paths; got %v; want %v", tc.args, seen, tc.want)
		}
		for _, p := range tc.want {
			if seen[p] == 0 {
				t.Errorf("%v: unexpected paths; got %v, no %s", tc.args, seen, p)
			}
		}
		mu.Unlock()
	}
}
