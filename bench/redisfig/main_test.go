package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// redisfig runs whole at small sizes and every section reports: the
// figures docs/DIRECTORY.md and BENCHMARKS.md quote come from it, and it
// broke once unnoticed (its two visibility workers shared an advertise
// URL, which since R-LS-3's takeover rule voids the first). A failure
// inside ends the test binary through log.Fatal, which fails the test too.
func TestRedisFigSmall_RSRV3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and three nodes")
	}
	for k, v := range map[string]string{"duration": "1s", "place": "200", "rounds": "50", "hot": "20", "conc": "4"} {
		if err := flag.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	out, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = out
	defer func() { os.Stdout = stdout }()
	main()
	os.Stdout = stdout
	b, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{
		"| 20 | ",               // steady state: the hot ids' row
		"| 1 node | 200 | 0 |",  // placements through one node, none failed
		"| 3 nodes | 200 | 0 |", // and through three
		"| A's Place returning | 50 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("unexpected output; want a line with %q in:\n%s", want, got)
		}
	}
}
