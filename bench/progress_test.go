package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -12345: "-12,345"} {
		if got := thousands(n); got != want {
			t.Fatalf("unexpected thousands(%d); got %q; want %q", n, got, want)
		}
	}
}

func TestProgressFinalLine(t *testing.T) {
	var buf bytes.Buffer
	live := &Live{}
	live.Done.Add(42)
	p := StartProgress(&buf, false, "hot/pinboard", time.Hour, live)
	p.Stop()
	out := buf.String()
	if !strings.Contains(out, "hot/pinboard") || !strings.Contains(out, "100%") || !strings.Contains(out, "err 0") {
		t.Fatalf("unexpected final progress line; got %q", out)
	}
}
