// Command pinboardctl is the operator CLI for pinboard: it lists workers,
// drains and undrains them, winds instances down and tells who owns an id,
// over pinboard's operator API (/registry/*).
//
// It reads PINBOARD_URL and PINBOARD_TOKEN like the fleet guide's curl
// examples; the token needs the pinboard:operator scope.
//
//	pinboardctl workers [--json]
//	pinboardctl health [--json]
//	pinboardctl drain CLIENT_ID [--deadline 5m]
//	pinboardctl undrain CLIENT_ID
//	pinboardctl wind-down NAMESPACE ID (--deadline 30s | --revoke)
//	pinboardctl where NAMESPACE ID [--json]
//
// Exit status: 0 done, 1 pinboard answered an error, 2 usage, 3 pinboard
// unreachable, 4 unauthorized or forbidden (401/403).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const usage = `pinboardctl: operate a pinboard fleet over its operator API.

Usage:
  pinboardctl [global flags] COMMAND [ARGS] [FLAGS]

Commands:
  workers                          list live workers (table; --json for the raw answer)
  health                           registry health: store, workers, cold-start quarantine
  drain CLIENT_ID [--deadline D]   stop new placements on a worker; with a deadline
                                   (5m, 90s or seconds), force-release its ids then
  undrain CLIENT_ID                take new placements again
  wind-down NS ID --deadline D     ask the owner of NS/ID to wind it down within D
  wind-down NS ID --revoke         revoke an earlier wind-down
  where NS ID                      which worker owns NS/ID

Global flags (before or after the command; "--" ends the flags, for an
id that starts with "-"):
  --url URL        pinboard base URL (default $PINBOARD_URL)
  --token TOKEN    operator token (default $PINBOARD_TOKEN; prefer the variable:
                   flags show up in process listings)
  --timeout D      time for the whole command (default 10s; 30s, 2m or seconds)
  --json           print pinboard's JSON answer instead of a summary

Environment:
  PINBOARD_URL     e.g. http://pinboard.internal:8080 (with the base path, if any)
  PINBOARD_TOKEN   a passport key with the pinboard:operator scope

Exit status: 0 done, 1 pinboard answered an error, 2 usage,
3 pinboard unreachable, 4 unauthorized or forbidden (401/403).
`

// options are the flags every command accepts.
type options struct {
	url, token string
	timeout    time.Duration
	json       bool
	deadline   string
	revoke     bool
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o := options{url: getenv("PINBOARD_URL"), token: getenv("PINBOARD_TOKEN"), timeout: 10 * time.Second}
	fs := flag.NewFlagSet("pinboardctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.url, "url", o.url, "")
	fs.StringVar(&o.token, "token", o.token, "")
	fs.Var((*timeoutFlag)(&o.timeout), "timeout", "")
	fs.BoolVar(&o.json, "json", false, "")
	fs.StringVar(&o.deadline, "deadline", "", "")
	fs.BoolVar(&o.revoke, "revoke", false, "")
	pos, err := parseInterspersed(fs, args)
	switch {
	case err == flag.ErrHelp || (err == nil && len(pos) > 0 && pos[0] == "help"):
		fmt.Fprint(stdout, usage)
		return exitOK
	case err == nil && len(pos) == 0:
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	if err != nil {
		return usageError(stderr, "%s", longFlagNames(err))
	}
	cmd, rest := pos[0], pos[1:]
	cmdFn, ok := commands[cmd]
	if !ok {
		if near := nearCommand(cmd); near != "" {
			return usageError(stderr, "unknown command %q (did you mean %s?)", cmd, near)
		}
		return usageError(stderr, "unknown command %q", cmd)
	}
	// An empty --deadline (a script's "--deadline $D" with D unset) read
	// as no flag at all: "drain c1 --deadline ''" drained for ever, its
	// ids never released, where a deadline was asked for.
	if o.deadline == "" && flagSet(fs, "deadline") {
		return usageError(stderr, "--deadline must be a duration like 30s or 5m, or seconds, got \"\"")
	}
	// A flag the command does not take would be dropped without a word
	// ("undrain c1 --deadline 5m" undrains now): refuse it.
	if o.deadline != "" && cmd != "drain" && cmd != "wind-down" {
		return usageError(stderr, "%s takes no --deadline (drain and wind-down do)", cmd)
	}
	if o.revoke && cmd != "drain" && cmd != "wind-down" {
		return usageError(stderr, "%s takes no --revoke (wind-down does)", cmd)
	}
	// Hints name where a value came from: a wrong --token is not fixed
	// by checking PINBOARD_TOKEN.
	urlName, tokenName := "PINBOARD_URL", "PINBOARD_TOKEN"
	if flagSet(fs, "url") {
		urlName = "--url"
	}
	if flagSet(fs, "token") {
		tokenName = "--token"
	}
	o.url = strings.TrimSpace(o.url)
	if o.url == "" {
		if urlName == "--url" {
			return usageError(stderr, "--url is empty: want a base URL like http://pinboard.internal:8080")
		}
		return usageError(stderr, "PINBOARD_URL is not set (or pass --url)")
	}
	u, err := url.Parse(o.url)
	if err == nil && u.User != nil {
		// Never sent (the token is), and not to be echoed in an error.
		return usageError(stderr, "%s must not carry a user or password: the operator API takes the token (PINBOARD_TOKEN or --token)", urlName)
	}
	if err != nil {
		// Neither the value as given nor url.Parse's error (which
		// quotes it) may show a password it holds.
		return usageError(stderr, "%s %q is not a URL: want a base URL like http://pinboard.internal:8080 (with the base path, if any)", urlName, redactUserinfo(o.url))
	}
	// A scheme is case-insensitive (RFC 3986 §3.1); url.Parse lowers it.
	if u.Scheme != "http" && u.Scheme != "https" || !strings.HasPrefix(o.url[len(u.Scheme):], "://") {
		return usageError(stderr, "%s %q must start with http:// or https://", urlName, redactUserinfo(o.url))
	}
	// Any '#' is refused, an empty fragment too: url.Parse leaves
	// Fragment "" for a value ending in '#', and the '#' then cut every
	// path joined after it (a drain POSTed to the base path itself).
	if u.Host == "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(o.url, "#") {
		return usageError(stderr, "%s %q must be a base URL like http://pinboard.internal:8080 (with the base path, if any)", urlName, o.url)
	}
	o.url = u.Scheme + o.url[len(u.Scheme):]
	if o.timeout <= 0 {
		return usageError(stderr, "--timeout must be positive, got %v", o.timeout)
	}
	// A token from a file or a Secret often ends in a newline, which no
	// header may carry: drop surrounding white space, refuse what is left.
	o.token = strings.TrimSpace(o.token)
	if o.token == "" {
		if tokenName == "--token" {
			return usageError(stderr, "--token is empty: the operator API needs a token with the pinboard:operator scope")
		}
		return usageError(stderr, "PINBOARD_TOKEN is not set (or pass --token): the operator API needs the pinboard:operator scope")
	}
	if ascii.IndexSpaceOrCtl(o.token) >= 0 {
		// "Bearer <token>" copied from a curl line: pinboardctl writes
		// the Authorization header itself.
		if len(o.token) > 7 && strings.EqualFold(o.token[:7], "bearer ") {
			return usageError(stderr, "%s starts with \"Bearer \": give the token alone (pinboardctl sends it as Authorization: Bearer …)", tokenName)
		}
		return usageError(stderr, "%s contains white space or a control character", tokenName)
	}
	c := &client{base: strings.TrimRight(o.url, "/"), token: o.token, http: newHTTPClient(o.timeout), urlName: urlName, tokenName: tokenName}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := cmdFn(ctx, c, &o, rest, stdout); err != nil {
		if ue, ok := err.(*usageErr); ok {
			return usageError(stderr, "%s", ue.msg)
		}
		fmt.Fprintf(stderr, "pinboardctl %s: %v\n", cmd, err)
		return exitCode(err)
	}
	return exitOK
}

// redactUserinfo hides what may be a user and password in a PINBOARD_URL
// that could not be parsed: everything before the last "@" of the
// authority (or, without "://", of the whole value, where nothing marks
// where a password ends but its "@"). A value that url.Parse refused
// (a bad port, a space, no scheme) was echoed whole, password included.
func redactUserinfo(s string) string {
	rest, prefix := s, ""
	if i := strings.Index(s, "://"); i >= 0 {
		prefix, rest = s[:i+3], s[i+3:]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndexByte(rest[:end], '@'); at >= 0 {
			return prefix + "xxxxx" + rest[at:]
		}
		return s
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		return "xxxxx" + rest[at:]
	}
	return s
}

type usageErr struct{ msg string }

func (e *usageErr) Error() string { return e.msg }

// nearCommand names the command cmd was most likely meant as: one it is a
// prefix of or that is a prefix of it ("worker", "wher", "drainn"), in
// any case; "" when none or more than one is.
func nearCommand(cmd string) string {
	c := strings.ToLower(cmd)
	found := ""
	for name := range commands {
		if c != "" && (strings.HasPrefix(name, c) || strings.HasPrefix(c, name)) {
			if found != "" {
				return ""
			}
			found = name
		}
	}
	return found
}

func badUsage(format string, args ...any) error { return &usageErr{fmt.Sprintf(format, args...)} }

func usageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "pinboardctl: "+format+"\n", args...)
	fmt.Fprintf(stderr, "run 'pinboardctl help' for usage\n")
	return exitUsage
}

// longFlagNames writes the flag package's parse errors with the flags'
// names as usage and the docs spell them ("--url", not "-url"): the
// package names a flag with one dash whatever the command line used.
func longFlagNames(err error) string {
	msg := err.Error()
	for _, prefix := range []string{"flag provided but not defined: -", "flag needs an argument: -", "for flag -"} {
		if i := strings.Index(msg, prefix); i >= 0 && !strings.HasPrefix(msg[i+len(prefix):], "-") {
			j := i + len(prefix)
			return msg[:j] + "-" + msg[j:]
		}
	}
	return msg
}

// flagSet reports whether the command line set flag name, to any value.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// parseInterspersed parses flags before, between and after positional
// arguments (the standard flag package stops at the first positional one).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			// Parse consumed the terminator: everything after it is
			// positional, ids starting with "-" included.
			return append(pos, rest...), nil
		}
		args = rest
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// timeoutFlag is --timeout: a Go duration (30s, 2m) or seconds, as
// --deadline reads them; "--timeout 5" was refused with flag's bare
// "parse error".
type timeoutFlag time.Duration

func (f *timeoutFlag) String() string { return time.Duration(*f).String() }

func (f *timeoutFlag) Set(s string) error {
	n, ok := readSeconds(s)
	if !ok || math.Abs(n) >= 1e9 { // past time.Duration's range
		// The flag package's error quotes the value already.
		return errors.New("must be a duration like 30s or 2m, or seconds")
	}
	*f = timeoutFlag(n * float64(time.Second))
	return nil
}
