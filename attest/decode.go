package attest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// Path-aware JSON helpers for the passport. encoding/json alone reports
// "cannot unmarshal string into Go struct field .providers.keys.scopes of
// type []string", which names neither the provider nor the key; operators
// fixing a passport at 3 a.m. need "providers[0].keys[1] "ci": scopes[2]".
// The helpers return errors phrased relative to the value they were given;
// callers prefix the path of that value.

// jsonObject is a decoded JSON object whose values are still raw.
type jsonObject map[string]json.RawMessage

// kindOf names the JSON type of raw for error messages.
func kindOf(raw json.RawMessage) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// checkSyntax validates raw as one JSON document and reports the byte offset
// of the first error.
func checkSyntax(raw []byte) error {
	var v json.RawMessage
	err := json.Unmarshal(raw, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("at offset %d: %w", se.Offset, err)
	}
	return err
}

func decodeObject(raw json.RawMessage) (jsonObject, error) {
	if k := kindOf(raw); k != "object" {
		return nil, fmt.Errorf("want an object, got %s", k)
	}
	var o jsonObject
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, err
	}
	return o, nil
}

func decodeArray(raw json.RawMessage) ([]json.RawMessage, error) {
	if k := kindOf(raw); k != "array" {
		return nil, fmt.Errorf("want an array, got %s", k)
	}
	var a []json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	return a, nil
}

func decodeString(raw json.RawMessage) (string, error) {
	if k := kindOf(raw); k != "string" {
		return "", fmt.Errorf("want a string, got %s", k)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	return s, nil
}

// decodeStrings decodes an array of strings; name prefixes the errors
// ("scopes: want an array, got object", "scopes[2]: want a string, got null").
func decodeStrings(raw json.RawMessage, name string) ([]string, error) {
	elems, err := decodeArray(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	out := make([]string, 0, len(elems))
	for i, e := range elems {
		s, err := decodeString(e)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", name, i, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// joinPath appends a member name to a path, quoting names that are not
// plain identifiers (namespace keys such as "/counters").
func joinPath(path, name string) string {
	plain := name != ""
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			plain = false
			break
		}
	}
	switch {
	case !plain:
		return path + "[" + strconv.Quote(name) + "]"
	case path == "":
		return name
	}
	return path + "." + name
}

// warnUnknown reports the members of obj not listed in known. Unknown fields
// are tolerated so a passport written for the Node pinboard keeps working
// (R-SRV-2 "drop-in"), but reported so a typo ("scope" for "scopes") does
// not silently grant or deny.
func warnUnknown(obj jsonObject, path string, warn func(string), known ...string) {
	var unknown []string
	for k := range obj {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		warn(joinPath(path, k) + ": unknown field, ignored")
	}
}

// warnDuplicateMembers reports each member name that appears more than
// once in one object of raw, a valid JSON document, by the path of that
// object. The passport is read as JavaScript's JSON.parse reads it (the
// Node pinboard's), so the last copy wins and a passport that parses
// there parses here; but a security setting written twice — a "*" policy
// of "deny" followed by one of "anonymous", a key's "scopes" or "token" —
// is more likely a merge accident than a choice, and only the last copy
// taking effect, silently, must not be how an operator finds out.
func warnDuplicateMembers(raw []byte, warn func(string)) {
	type frame struct {
		path    string
		object  bool
		n       int    // array: elements read
		key     string // object: the member whose value is next
		wantKey bool
		seen    map[string]int
	}
	var stack []*frame
	// next names the value about to be read in the innermost container.
	next := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := stack[len(stack)-1]
		if f.object {
			f.wantKey = true
			return joinPath(f.path, f.key)
		}
		f.n++
		return f.path + "[" + strconv.Itoa(f.n-1) + "]"
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err != nil {
			return // io.EOF: checkSyntax already refused anything else
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			if k, ok := tok.(string); ok {
				f := stack[n-1]
				if f.seen[k]++; f.seen[k] == 2 {
					where := f.path
					if where == "" {
						where = "passport"
					}
					warn(fmt.Sprintf("%s: member %q appears more than once; only the last one is used", where, k))
				}
				f.key, f.wantKey = k, false
				continue
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, &frame{path: next(), object: tok == json.Delim('{'), wantKey: true, seen: map[string]int{}})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		default:
			next()
		}
	}
}
