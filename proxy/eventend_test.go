package proxy

import "testing"

// A sized event stream stopped early (its session ended, R-LS-2) ends
// cleanly only if what went out so far ends an event, whatever the line
// ends and however the reads split it; mid-event it is cut (R-DP-2).
func TestSizedEventStreamEventEnd_RLS2_RDP2(t *testing.T) {
	cases := []struct {
		reads []string
		want  bool
	}{
		{nil, true}, // nothing yet: between events
		{[]string{"data: a\n\n"}, true},
		{[]string{"data: a\r\r"}, true},
		{[]string{"data: a\r\n\r\n"}, true},
		{[]string{"data: a\r\n\n"}, true},
		{[]string{"data: a\n\r\n"}, true},
		{[]string{"data: a\r\r\n"}, true},
		{[]string{"data: a\r\n", "\r", "\n"}, true},
		{[]string{"data: a\n", "\n"}, true},
		{[]string{"d", "a", "t", "a", ":", "\n", "\n"}, true},
		{[]string{"data: a\n\n", "data: b"}, false},
		{[]string{"data: a\n"}, false},
		{[]string{"data: a\r\n"}, false},
		{[]string{"data: a\r"}, false},
		{[]string{"data: a\n\n", "data: b\n"}, false},
		{[]string{"data: a\n\n", ""}, true},
		{[]string{"\n"}, true}, // a blank line at the start: still between events
		{[]string{"x"}, false},
	}
	for _, c := range cases {
		b := &upstreamBody{tail: blankLine}
		for _, r := range c.reads {
			b.noteTail([]byte(r))
		}
		if got := b.eventEnd(); got != c.want {
			t.Errorf("unexpected event end after reads %q; got %v; want %v", c.reads, got, c.want)
		}
	}
}
