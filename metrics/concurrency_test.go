package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/registry"
)

// Scrapes taken while many goroutines record (new namespaces and store
// operations learned meanwhile) are each well formed: every histogram's
// buckets cumulative and its +Inf bucket equal to its _count, and no
// counter, _bucket, _sum or _count lower than in the scrape before.
// Run with -race.
func TestScrapeWhileRecording(t *testing.T) {
	m := New(Options{MaxNamespaces: 16, MaxStoreOps: 4})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errDown := errors.New("down")
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m.Request(fmt.Appendf(nil, "/ns%d", (g*7+i)%24), 100+(i%6)*100, time.Duration(i%5000)*time.Microsecond)
				m.Request(nil, 404, time.Microsecond)
				m.UpstreamError("read")
				m.Resolve(i%2 == 0)
				m.Placement(i%3 == 0)
				m.Heartbeat(time.Duration(i%100)*time.Millisecond, "ok")
				m.Probe(time.Millisecond, registry.ProbeResult(i%4))
				m.StoreCommand(fmt.Sprint("op", i%6), time.Duration(i%1000)*time.Microsecond, errDown)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	prev := map[string]float64{}
	for n := 0; n < 50; n++ {
		got := scrape(t, m)
		cur := map[string]float64{}
		types := map[string]string{}
		for _, line := range strings.Split(string(m.AppendPrometheus(t.Context(), nil)), "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
				types[f[2]] = f[3]
			}
		}
		for series, v := range got {
			name, _, _ := strings.Cut(series, "{")
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
			if types[name] != "counter" && types[base] != "histogram" {
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("unexpected value %q for %s", v, series)
			}
			cur[series] = f
			if p, ok := prev[series]; ok && f < p {
				t.Errorf("scrape %d: unexpected decrease of %s; got %v; want >= %v", n, series, f, p)
			}
		}
		checkHistograms(t, got)
		prev = cur
	}
}

// checkHistograms checks every histogram series in got: buckets
// cumulative in le order, +Inf equal to _count, _sum present.
func checkHistograms(t *testing.T, got map[string]string) {
	t.Helper()
	type bucket struct {
		le float64
		n  uint64
	}
	hists := map[string][]bucket{} // name{other labels} -> buckets
	for series, v := range got {
		name, labels, ok := strings.Cut(series, "_bucket{")
		if !ok {
			continue
		}
		i := strings.Index(labels, `le="`)
		leStr := labels[i+4 : i+4+strings.IndexByte(labels[i+4:], '"')]
		rest := strings.TrimSuffix(strings.TrimSuffix(labels[:i], ","), "}")
		key := name
		if rest != "" {
			key += "{" + rest + "}"
		}
		le, err := strconv.ParseFloat(leStr, 64)
		if err != nil {
			t.Fatalf("unexpected le %q in %s", leStr, series)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("unexpected bucket value %q in %s", v, series)
		}
		hists[key] = append(hists[key], bucket{le, n})
	}
	for key, bs := range hists {
		for i := range bs {
			for j := i + 1; j < len(bs); j++ {
				if (bs[j].le < bs[i].le) != (bs[j].n < bs[i].n) && bs[j].n != bs[i].n {
					t.Errorf("unexpected non-cumulative buckets in %s: le=%v %d, le=%v %d", key, bs[i].le, bs[i].n, bs[j].le, bs[j].n)
				}
			}
		}
		name, labels, _ := strings.Cut(key, "{")
		suffix := ""
		if labels != "" {
			suffix = "{" + labels
		}
		count, ok := got[name+"_count"+suffix]
		if !ok {
			t.Errorf("unexpected histogram %s without _count", key)
		}
		if _, ok := got[name+"_sum"+suffix]; !ok {
			t.Errorf("unexpected histogram %s without _sum", key)
		}
		inf := ""
		for _, b := range bs {
			if b.le > 1e300 {
				inf = strconv.FormatUint(b.n, 10)
			}
		}
		if inf != count {
			t.Errorf("unexpected torn histogram %s: +Inf bucket %q, _count %q", key, inf, count)
		}
	}
}
