package metrics

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Every metric family the admin listener exposes is a row of
// docs/OPERATIONS.md's metrics table with the labels that row names, and
// every row names a family that is exposed: an operator's dashboards and
// alerts are written from that table.
func TestOperationsTableListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	// Rows: "| `name`[, `name`…] | type | labels | meaning |".
	row := regexp.MustCompile("(?m)^\\| (`[a-z_]+`(?:, `[a-z_]+`)*) \\| *([a-z]*) *\\| *([^|]*)\\|")
	tick := regexp.MustCompile("`([a-z_]+)`")
	documented := map[string][]string{} // family -> label names, sorted
	docTypes := map[string]string{}     // family -> type, where the row gives one
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		var labels []string
		for _, l := range tick.FindAllStringSubmatch(m[3], -1) {
			labels = append(labels, l[1])
		}
		slices.Sort(labels)
		for _, n := range tick.FindAllStringSubmatch(m[1], -1) {
			if strings.HasPrefix(n[1], "pinboard_") || strings.HasPrefix(n[1], "go_") || strings.HasPrefix(n[1], "process_") {
				documented[n[1]] = labels
				if m[2] != "" {
					docTypes[n[1]] = m[2]
				}
			}
		}
	}
	if len(documented) < 20 {
		t.Fatalf("found only %d metrics in docs/OPERATIONS.md: has the table's format changed?", len(documented))
	}

	// Every family present: sources attached, a store round trip recorded.
	m := New(Options{Version: "test"})
	one := func() int64 { return 1 }
	two := func() int { return 2 }
	m.Attach(Sources{
		Store:       directory.NewMemory(15*time.Second, time.Now()),
		OpenStreams: one, OpenEventStreams: one, OpenWebSockets: one, OpenConnections: one,
		RegistryQueue: two, RegistryRunning: two, RegistryCap: two,
	})
	m.StoreCommand("place", time.Millisecond, nil)
	exposed := map[string][]string{}
	family := regexp.MustCompile(`^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) `)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	types := map[string]string{}
	for _, line := range strings.Split(string(m.AppendPrometheus(context.Background(), nil)), "\n") {
		if f := family.FindStringSubmatch(line); f != nil {
			types[f[1]] = strings.Fields(line)[3]
			exposed[f[1]] = nil
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		if types[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")] == "histogram" {
			name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		}
		labels := exposed[name]
		for _, l := range label.FindAllStringSubmatch(rest, -1) {
			if l[1] != "le" && !slices.Contains(labels, l[1]) {
				labels = append(labels, l[1])
			}
		}
		slices.Sort(labels)
		exposed[name] = labels
	}
	for name, labels := range exposed {
		doc, ok := documented[name]
		if !ok {
			t.Errorf("pinboard exposes %s but docs/OPERATIONS.md's metrics table does not list it", name)
			continue
		}
		if !slices.Equal(doc, labels) {
			t.Errorf("unexpected labels for %s in docs/OPERATIONS.md; got %v; want %v", name, doc, labels)
		}
		if typ, ok := docTypes[name]; ok && typ != types[name] {
			t.Errorf("unexpected type for %s in docs/OPERATIONS.md; got %s; want %s", name, typ, types[name])
		}
	}
	for name := range documented {
		if _, ok := exposed[name]; !ok {
			t.Errorf("docs/OPERATIONS.md lists %s, which pinboard does not expose", name)
		}
	}
}
