package scenario

import (
	"strings"
	"testing"

	"github.com/pinboard-go/pinboard/bench"
)

// TestGoalsNotMetWithFailedRequests: a target that answered part of its
// requests with errors (or dropped arrivals) has not met a latency or CPU
// goal, however fast its failures were.
func TestGoalsNotMetWithFailedRequests(t *testing.T) {
	run := func(res *Results, phase, target string, latUs float64, ok uint64, errs map[string]uint64, dropped uint64) {
		h := bench.NewHist()
		h.RecordN(int64(latUs*1000), ok+dropped)
		for _, n := range errs {
			h.RecordN(50_000, n) // a fast 502
		}
		res.add(&Record{Scenario: "hot", Target: target, Phase: phase, Round: 1, ProxyCPUus: 10,
			Summary: bench.Summary{Rate: 3000, RPS: 30000, OK: ok, Errors: errs, Dropped: dropped, LatHist: bench.BucketsOf(h)}})
	}
	res := &Results{Rounds: 1}
	run(res, "peak", nginx, 2000, 1000, nil, 0)
	run(res, "peak", pinboard, 2000, 1000, nil, 0)
	run(res, "latency", nginx, 4000, 1000, nil, 0)
	// A fifth of pinboard's requests failed fast: its p99 is of the rest.
	run(res, "latency", pinboard, 3000, 800, map[string]uint64{"http_502": 200}, 0)
	checked := 0
	for _, g := range Goals(res) {
		if !strings.HasPrefix(g.Name, "Hot ids: p99") && !strings.HasPrefix(g.Name, "Hot ids: proxy CPU") {
			continue
		}
		checked++
		if !g.Known {
			t.Fatalf("unexpected goal not evaluated; got %+v; want it measured", g)
		}
		if g.Met {
			t.Fatalf("goal met despite 20%% failed requests: %+v", g)
		}
	}
	if checked != 2 {
		t.Fatalf("unexpected goals checked; got %d; want 2 (the hot p99 and CPU goals)", checked)
	}
}

// goal returns the goal of res whose name starts with prefix.
func goal(t *testing.T, res *Results, prefix string) Goal {
	t.Helper()
	for _, g := range Goals(res) {
		if strings.HasPrefix(g.Name, prefix) {
			return g
		}
	}
	t.Fatalf("unexpected goals without %q", prefix)
	return Goal{}
}

// TestIdleStreamsGoalNotMetWithFailedStreams: RSS growth with fewer idle
// streams open than attempted says nothing about the attempted number.
func TestIdleStreamsGoalNotMetWithFailedStreams(t *testing.T) {
	res := &Results{Rounds: 1}
	res.fact("sse.idle.streams", 10000)
	res.fact("sse.idle.pinboard.rssBeforeMiB", 30.0)
	res.fact("sse.idle.pinboard.rssGrowthMiB", 50.0)
	res.fact("sse.idle.pinboard.rssAfterMiB", 80.0)
	res.fact("sse.idle.pinboard.kibPerStream", 10.0)
	res.fact("sse.idle.pinboard.failed", 5000)
	res.fact("sse.idle.pinboard.fds", 20100) // two per stream held, and the node's own
	g := goal(t, res, "SSE: 10,000 idle streams")
	if !g.Known || g.Met {
		t.Fatalf("unexpected goal met with half the streams failed; got %+v; want not met", g)
	}
	if !strings.Contains(g.Measured, "5,000 failed") {
		t.Fatalf("unexpected measured; got %q; want the failed streams counted", g.Measured)
	}
	res.fact("sse.idle.pinboard.failed", 0)
	if g := goal(t, res, "SSE: 10,000 idle streams"); !g.Met {
		t.Fatalf("unexpected goal; got %+v; want met without failures", g)
	}
}

// TestLargeBodiesGoalNotMetWithFailedTransfers: a transfer that failed
// part way moved less than the body, so its small RSS growth meets
// nothing.
func TestLargeBodiesGoalNotMetWithFailedTransfers(t *testing.T) {
	res := &Results{Rounds: 1}
	res.Large = append(res.Large,
		LargeRun{Target: pinboard, Direction: "upload", Bytes: 1 << 30, RSSBeforeMiB: 50, RSSGrowthMiB: 0.1},
		LargeRun{Target: pinboard, Direction: "download", Bytes: 3 << 20, RSSBeforeMiB: 50, RSSGrowthMiB: 0.1, Error: "cannot read the response body: EOF"})
	g := goal(t, res, "Large bodies")
	if !g.Known || g.Met {
		t.Fatalf("unexpected goal met with a failed transfer; got %+v; want not met", g)
	}
	if !strings.Contains(g.Measured, "1 failed") {
		t.Fatalf("unexpected measured; got %q; want the failed transfer counted", g.Measured)
	}
}

// TestStormImpactGoalNeedsBothWindows: with no storm-off window (a run
// cut short, a partial results.json) the impact compares nothing; 0 was
// taken for it and the goal read as met.
func TestStormImpactGoalNeedsBothWindows(t *testing.T) {
	res := &Results{Rounds: 1}
	h := bench.NewHist()
	h.RecordN(8_000_000, 100)
	res.add(&Record{Scenario: "storm", Target: pinboard, Phase: "storm-on", Round: 1,
		Summary: bench.Summary{Rate: 1000, RPS: 1000, OK: 100, LatHist: bench.BucketsOf(h)}})
	res.Storm = append(res.Storm, StormPhase{Round: 1, On: true, Workers: 10000})
	g := goal(t, res, "Heartbeat storm: data-plane p99 impact")
	if g.Known || g.Met {
		t.Fatalf("unexpected goal without a storm-off window; got %+v; want not measured", g)
	}
}

// TestGoalsNotMetOnUnreadProcessFigures: the proxy's CPU and RSS come
// from /proc/<pid>/stat; a read that failed left 0, which read as no CPU
// per request and no memory growth — goals met on figures never measured.
func TestGoalsNotMetOnUnreadProcessFigures(t *testing.T) {
	res := &Results{Rounds: 1}
	h := bench.NewHist()
	h.RecordN(1_000_000, 1000)
	for _, phase := range []string{"peak", "latency"} {
		res.add(&Record{Scenario: "hot", Target: nginx, Phase: phase, Round: 1, ProxyCPUus: 40,
			Summary: bench.Summary{Rate: 3000, RPS: 30000, OK: 1000, LatHist: bench.BucketsOf(h)}})
		res.add(&Record{Scenario: "hot", Target: pinboard, Phase: phase, Round: 1,
			Summary: bench.Summary{Rate: 3000, RPS: 30000, OK: 1000, LatHist: bench.BucketsOf(h)}})
	}
	if g := goal(t, res, "Hot ids: proxy CPU"); !g.Known || g.Met || !strings.Contains(g.Measured, "not read") {
		t.Fatalf("unexpected CPU goal on an unread CPU; got %+v; want not met, said", g)
	}
	res.Large = append(res.Large, LargeRun{Target: pinboard, Direction: "upload", Bytes: 1 << 30})
	if g := goal(t, res, "Large bodies"); !g.Known || g.Met || !strings.Contains(g.Measured, "not read") {
		t.Fatalf("unexpected large-bodies goal on an unread RSS; got %+v; want not met, said", g)
	}
	res.Large[0].RSSBeforeMiB = 50
	if g := goal(t, res, "Large bodies"); !g.Met {
		t.Fatalf("unexpected large-bodies goal on a read RSS; got %+v; want met", g)
	}
	res.fact("sse.idle.streams", 10000)
	res.fact("sse.idle.pinboard.rssGrowthMiB", 0)
	res.fact("sse.idle.pinboard.kibPerStream", 0)
	if g := goal(t, res, "SSE: 10,000 idle streams"); !g.Known || g.Met || !strings.Contains(g.Measured, "not read") {
		t.Fatalf("unexpected idle-streams goal on an unread RSS; got %+v; want not met, said", g)
	}
}

// TestSSEGoalOnEventsAfterEveryStreamOpened: the SSE goal is judged on
// the events sent once every stream was open (the "delay" phase), and
// the events sent while the generator still opened streams are shown
// beside it (the "delay-all" phase), in the goal row and the table.
func TestSSEGoalOnEventsAfterEveryStreamOpened(t *testing.T) {
	res := &Results{Rounds: 1}
	add := func(phase, target string, p99Us float64) {
		h := bench.NewHist()
		h.RecordN(100_000, 980)
		h.RecordN(int64(p99Us*1000), 20)
		res.add(&Record{Scenario: "sse", Target: target, Phase: phase, Round: 1,
			Summary: bench.Summary{OK: 1000, LatHist: bench.BucketsOf(h)}})
	}
	add("delay", direct, 1000)
	add("delay", pinboard, 1500)
	add("delay-all", direct, 5000)
	add("delay-all", pinboard, 20000)
	g := goal(t, res, "SSE: added delay")
	if !g.Met {
		t.Fatalf("unexpected goal on the steady events (0.5 ms added); got %+v; want met", g)
	}
	res.fact("sse.delay.afterOpen", 1)
	g = goal(t, res, "SSE: added delay")
	if !g.Met || !strings.Contains(g.Measured, "once every stream was open") || !strings.Contains(g.Measured, "15.04ms counting those sent while streams opened") {
		t.Fatalf("unexpected goal; got %+v; want met on the steady events, the 15 ms of all events said", g)
	}
	md := Markdown(res, nil, nil)
	if !strings.Contains(md, "| p99, all events |") || !strings.Contains(md, "| 20.05ms | 15.04ms |") {
		t.Fatalf("unexpected SSE table without the all-events p99 of 20 ms (15 ms added):\n%s", md)
	}
}
