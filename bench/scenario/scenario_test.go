package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/fleet"
)

// TestSpreadOrderMovesEveryTarget: the hot-ids scenario's five targets
// in three rounds each run in three different places — pinboard is not
// always behind the relays — and no target runs first or last twice;
// with as many rounds as targets it is orderFor.
func TestSpreadOrderMovesEveryTarget(t *testing.T) {
	pos := map[string][]int{}
	first, last := map[string]int{}, map[string]int{}
	for round := 1; round <= 3; round++ {
		o := spreadOrder(hotTargets, round, 3)
		if len(o) != len(hotTargets) {
			t.Fatalf("unexpected order; got %v", o)
		}
		for i, name := range o {
			pos[name] = append(pos[name], i)
		}
		first[o[0]]++
		last[o[len(o)-1]]++
	}
	for _, name := range hotTargets {
		p := pos[name]
		if len(p) != 3 || p[0] == p[1] || p[1] == p[2] || p[0] == p[2] || first[name] > 1 || last[name] > 1 {
			t.Errorf("unexpected places of %s over three rounds; got %v (first %d, last %d times); want three different, first and last at most once", name, p, first[name], last[name])
		}
	}
	ahead := 0 // rounds with pinboard ahead of both relays (orderFor: none)
	for r := 0; r < 3; r++ {
		if pos[pinboard][r] < pos[relayGoroutine][r] && pos[pinboard][r] < pos[relayEpoll][r] {
			ahead++
		}
	}
	if ahead == 0 {
		t.Errorf("unexpected order: pinboard behind both relays in every round; got places %v", pos)
	}
	for round := 1; round <= 5; round++ {
		if got, want := spreadOrder(hotTargets, round, 5), orderFor(hotTargets, round); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("round %d of 5: got %v; want orderFor's %v", round, got, want)
		}
	}
}

func TestOrderForRotates(t *testing.T) {
	first := map[string]int{}
	for round := 1; round <= 3; round++ {
		o := orderFor(allTargets, round)
		if len(o) != 3 {
			t.Fatalf("unexpected order length; got %v", o)
		}
		first[o[0]]++
	}
	for _, name := range allTargets {
		if first[name] != 1 {
			t.Fatalf("unexpected rotation: each target should run first once in three rounds; got %v", first)
		}
	}
}

func TestOpenRate(t *testing.T) {
	for _, c := range []struct {
		peaks []float64
		want  float64
	}{
		{[]float64{12000, 9000}, 3000},
		{[]float64{12000, 10400}, 3000},
		{[]float64{0, 0}, 1000},
		{[]float64{900}, 500},
	} {
		if got := openRate(c.peaks...); got != c.want {
			t.Fatalf("unexpected openRate(%v); got %v; want %v", c.peaks, got, c.want)
		}
	}
}

// TestBaselineRequestsCarryValidAttestations: what the generator sends
// to the fleet directly (and through nginx) names the worker in the path
// and carries an attestation the worker accepts — the same backend work
// pinboard's requests cause.
func TestBaselineRequestsCarryValidAttestations(t *testing.T) {
	ws := []fleet.WorkerInfo{
		{Index: 3, SessionID: "sess-3", Secret: strings.Repeat("a", 64)},
		{Index: 7, SessionID: "sess-7", Secret: strings.Repeat("b", 64)},
	}
	rt := newRoute(&target{name: direct, addrs: []string{"127.0.0.1:1"}, viaWorker: true}, ws)
	reqs := rt.hotRequests("/bench", 4, "json")
	if got := string(reqs[1]); !strings.HasPrefix(got, "GET /w/7/bench/h1/json HTTP/1.1\r\n") {
		t.Fatalf("unexpected request; got %q", got)
	}
	for i, raw := range reqs {
		w := ws[i%2]
		line := ""
		for _, l := range strings.Split(string(raw), "\r\n") {
			if v, ok := strings.CutPrefix(l, attest.HeaderName+": "); ok {
				line = v
			}
		}
		if _, err := attest.VerifyAttestation(line, []byte(w.Secret), []string{w.SessionID}, time.Now()); err != nil {
			t.Fatalf("unexpected attestation on request %d: %v", i, err)
		}
	}
	pb := newRoute(&target{name: pinboard, addrs: []string{"127.0.0.1:2"}}, nil)
	if got := string(pb.hotRequests("/bench", 1, "json")[0]); got != "GET /bench/h0/json HTTP/1.1\r\nHost: bench.local\r\n\r\n" {
		t.Fatalf("unexpected pinboard request; got %q", got)
	}
}

func TestMarkdownKeepsBlocksVerbatim(t *testing.T) {
	old := "# Benchmarks\nsee `<!-- x:begin -->` and `<!-- x:end -->` inline\nold tables\n<!-- redis:begin -->\n## Redis\n| a | b |\nkeep *exactly* this\n<!-- redis:end -->\n" +
		"trailing text\n<!-- analysis:begin -->\nmy notes\n<!-- analysis:end -->\n<!-- bad:begin -->unterminated"
	blocks := preservedBlocks(old)
	if len(blocks) != 2 {
		t.Fatalf("unexpected blocks; got %q", blocks)
	}
	res := &Results{Rounds: 3, Machine: Machine{NProc: 2, CPU: "test CPU"}}
	res.add(&Record{Scenario: "hot", Target: pinboard, Phase: "peak", Round: 1, Summary: bench.Summary{RPS: 10000, OK: 1}, ProxyCPUus: 40})
	res.add(&Record{Scenario: "hot", Target: nginx, Phase: "peak", Round: 1, Summary: bench.Summary{RPS: 9000, OK: 1}, ProxyCPUus: 41})
	res.add(&Record{Scenario: "hot", Target: direct, Phase: "peak", Round: 1, Summary: bench.Summary{RPS: 20000, OK: 1}})
	doc := Markdown(res, nil, blocks)
	for _, want := range []string{
		"<!-- redis:begin -->\n## Redis\n| a | b |\nkeep *exactly* this\n<!-- redis:end -->",
		"<!-- analysis:begin -->\nmy notes\n<!-- analysis:end -->",
		"| pinboard | 10,000 | 10,000–10,000 | 0.50× | 1.11× | 40.0 |",
		"| Hot ids: peak throughput | ≥ nginx | 10,000 vs 9,000 req/s (1.11×) | **yes** |",
		"test CPU",
	} {
		if !strings.Contains(doc, want) {
			t.Fatalf("unexpected markdown: missing %q in\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "old tables") || strings.Contains(doc, "trailing text") {
		t.Fatal("unexpected stale text outside the kept blocks")
	}
	// A document without an analysis block gets an empty one to fill in.
	if doc := Markdown(res, nil, nil); !strings.Contains(doc, "<!-- analysis:begin -->") {
		t.Fatal("unexpected markdown without an analysis block")
	}
}

func TestAggregateMedianAndMergedLatency(t *testing.T) {
	res := &Results{}
	for i, rps := range []float64{100, 300, 200} {
		h := bench.NewHist()
		h.RecordN(int64((i+1)*1000_000), 10)
		res.add(&Record{Scenario: "hot", Target: pinboard, Phase: "peak", Round: i + 1,
			Summary: bench.Summary{RPS: rps, OK: 10, LatHist: bench.BucketsOf(h), Errors: map[string]uint64{"http_503": 1}}})
	}
	a := res.Aggregate("hot", "peak", pinboard)
	if a.N != 3 || a.RPS != 200 || a.RPSMin != 100 || a.RPSMax != 300 || a.Errors != 3 || a.OK != 30 {
		t.Fatalf("unexpected aggregate; got %+v", a)
	}
	if a.Hist.Count() != 30 || a.Latency.Max < 2990 {
		t.Fatalf("unexpected merged latency; got %d values, max %vµs", a.Hist.Count(), a.Latency.Max)
	}
	if res.Aggregate("hot", "latency", pinboard).N != 0 {
		t.Fatal("unexpected aggregate of a phase that never ran")
	}
}

// TestResultsRoundTrip: results.json holds what the report needs, so
// `pinbench report` renders the same document from it.
func TestResultsRoundTrip(t *testing.T) {
	res := &Results{Rounds: 1, Machine: Machine{NProc: 2}}
	h := bench.NewHist()
	h.RecordN(250_000, 100)
	res.add(&Record{Scenario: "hot", Target: pinboard, Phase: "latency", Round: 1, ForeignCores: 0.5,
		Summary: bench.Summary{Rate: 3000, RPS: 2999, OK: 100, LatHist: bench.BucketsOf(h)}})
	res.Large = append(res.Large, LargeRun{Target: pinboard, Direction: "upload", Bytes: 1 << 30, RSSGrowthMiB: 1.5})
	back := throughJSON(t, res)
	a, want := back.Aggregate("hot", "latency", pinboard), res.Aggregate("hot", "latency", pinboard)
	if a.N != 1 || a.Latency.P99 != want.Latency.P99 || a.Foreign != 0.5 || len(back.Large) != 1 {
		t.Fatalf("unexpected round trip; got %+v", a)
	}
	if Markdown(back, nil, nil) != Markdown(res, nil, nil) {
		t.Fatal("unexpected difference between the documents before and after the round trip")
	}
}

// TestRedisCommandsGoal: the Redis figure is judged on the commands
// requests cause (background subtracted), reported next to the total,
// and survives results.json.
func TestRedisCommandsGoal(t *testing.T) {
	res := &Results{Rounds: 3}
	for _, v := range [][3]float64{{0.020, 0.0004, 85}, {0.018, 0.0002, 80}, {0.025, 0.0031, 90}} {
		res.appendFact("redis.commandsPerRequest", v[0])
		res.appendFact("redis.requestCommandsPerRequest", v[1])
		res.appendFact("redis.backgroundPerSecond", v[2])
	}
	find := func(r *Results) Goal {
		for _, g := range Goals(r) {
			if strings.HasPrefix(g.Name, "Redis commands") {
				return g
			}
		}
		t.Fatal("no Redis goal")
		return Goal{}
	}
	g := find(res)
	if !g.Known || !g.Met || g.Measured != "0.0004 caused by requests (0.0200 with the fleet's heartbeats)" {
		t.Fatalf("unexpected goal; got %+v", g)
	}
	for range 3 {
		res.appendFact("redis.requestCommandsPerRequest", 0.5)
	}
	if find(res).Met {
		t.Fatal("unexpected goal met with a median of 0.5")
	}
	back := throughJSON(t, res)
	if got, want := back.factList("redis.requestCommandsPerRequest"), res.factList("redis.requestCommandsPerRequest"); !slices.Equal(got, want) {
		t.Fatalf("unexpected facts after the round trip; got %v; want %v", got, want)
	}
	if len(find(&Results{}).Measured) != 0 || find(&Results{}).Known {
		t.Fatal("unexpected Redis goal without a Redis run")
	}
}

// throughJSON writes res as results.json and reads it back.
func throughJSON(t *testing.T, res *Results) *Results {
	t.Helper()
	path := filepath.Join(t.TempDir(), "results.json")
	if err := res.write(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	return &back
}

// TestStormImpactLeavesOutLoudRounds: the storm's data-plane impact
// compares the rounds whose windows were all measured without other
// load, says how many windows it left out, and keeps every window (and
// says so) when no round was quiet.
func TestStormImpactLeavesOutLoudRounds(t *testing.T) {
	window := func(res *Results, phase string, round int, p99us, foreign, cores float64) {
		h := bench.NewHist()
		h.RecordN(int64(p99us*1000), 100)
		res.add(&Record{Scenario: "storm", Target: pinboard, Phase: phase, Round: round, ForeignCores: foreign, ProxyCores: cores,
			Summary: bench.Summary{Rate: 1000, RPS: 1000, OK: 100, LatHist: bench.BucketsOf(h)}})
		res.Storm = append(res.Storm, StormPhase{Round: round, On: phase == "storm-on", Workers: 10})
	}
	res := &Results{Rounds: 2}
	window(res, "storm-on", 1, 8000, 0, 0.6)
	window(res, "storm-off", 1, 4000, 0, 0.2)
	window(res, "storm-off", 2, 9000, 0.5, 0.9) // another tenant took half a CPU
	window(res, "storm-on", 2, 3000, 0.1, 0.9)  // its round goes with it
	st := stormSummary(res)
	if st.loud != 2 || st.loudKept != 0 || st.onAgg.N != 1 || st.offAgg.N != 1 {
		t.Fatalf("unexpected windows; got %d left out, %d kept loud, %d on, %d off; want 2, 0, 1, 1", st.loud, st.loudKept, st.onAgg.N, st.offAgg.N)
	}
	if st.impact < 0.9 || st.impact > 1.1 || st.onAgg.ProxyCores != 0.6 || st.offAgg.ProxyCores != 0.2 {
		t.Fatalf("unexpected comparison; got %+.0f%% and cores %.1f/%.1f; want about +100%% (8 ms on vs 4 ms off) and 0.6/0.2", st.impact*100, st.onAgg.ProxyCores, st.offAgg.ProxyCores)
	}
	g := goal(t, res, "Heartbeat storm: data-plane p99 impact")
	if g.Met || !strings.Contains(g.Measured, "; the rounds of 2 windows under other load left out") {
		t.Fatalf("unexpected goal; got %+v", g)
	}
	if md := Markdown(res, nil, nil); !strings.Contains(md, "| pinboard | off (1 window) |") || !strings.Contains(md, "left out of every row (2 windows here)") {
		t.Fatalf("unexpected storm section:\n%s", md)
	}

	// No quiet round: compare them all rather than nothing, and say so.
	res = &Results{Rounds: 1}
	window(res, "storm-on", 1, 8000, 0, 0.6)
	window(res, "storm-off", 1, 8000, 0.5, 0.2)
	st = stormSummary(res)
	if st.loud != 0 || st.loudKept != 1 || st.offAgg.N != 1 || st.impact > 0.1 {
		t.Fatalf("unexpected fallback; got %d left out, %d kept, %d off, impact %+.0f%%", st.loud, st.loudKept, st.offAgg.N, st.impact*100)
	}
	if n := st.loudNote(); n != "; no round without other load, 1 window under it kept" {
		t.Fatalf("unexpected note; got %q", n)
	}
}

// TestStormBaselinesInSameRounds: nginx's and direct's storm windows
// are compared over the same rounds as pinboard's — a round another
// tenant made loud in any target's window goes for all of them — and the
// goal names their impacts beside pinboard's without judging on them.
// Results written before the baselines joined have no target: pinboard.
func TestStormBaselinesInSameRounds(t *testing.T) {
	window := func(res *Results, target, phase string, round int, p99us, foreign float64) {
		h := bench.NewHist()
		h.RecordN(int64(p99us*1000), 100)
		res.add(&Record{Scenario: "storm", Target: target, Phase: phase, Round: round, ForeignCores: foreign, ProxyCores: 0.5,
			Summary: bench.Summary{Rate: 1000, RPS: 1000, OK: 100, LatHist: bench.BucketsOf(h), Latency: bench.Percentiles{P99: p99us}}})
		res.Storm = append(res.Storm, StormPhase{Round: round, On: phase == "storm-on", Workers: 10000})
	}
	res := &Results{Rounds: 3}
	// Rounds 1 and 2: pinboard ×3, both baselines ×1.5 (pinboard's beyond
	// theirs +100 %); round 2 had a tenant in nginx's window only. Round
	// 3: pinboard ×2, the baselines ×2 (+0 %).
	for _, w := range []struct {
		round               int
		loud                float64
		pin, ngOn, dOn, dOf float64
	}{{1, 0, 6000, 3000, 1500, 1000}, {2, 0.9, 6000, 3000, 1500, 1000}, {3, 0, 4000, 4000, 2000, 1000}} {
		window(res, pinboard, "storm-on", w.round, w.pin, 0)
		window(res, pinboard, "storm-off", w.round, 2000, 0)
		window(res, nginx, "storm-on", w.round, w.ngOn, w.loud)
		window(res, nginx, "storm-off", w.round, 2000, 0)
		window(res, direct, "storm-on", w.round, w.dOn, 0)
		window(res, direct, "storm-off", w.round, w.dOf, 0)
	}
	st := stormSummary(res)
	if st.loud != 6 || st.onAgg.N != 2 || st.offAgg.N != 2 || len(st.baselines) != 2 {
		t.Fatalf("unexpected windows; got %d left out, %d/%d pinboard, %d baselines; want 6, 2/2, 2", st.loud, st.onAgg.N, st.offAgg.N, len(st.baselines))
	}
	if st.impact < 1.9 || st.impact > 2.1 || st.onAgg.ProxyCores != 0.5 {
		t.Fatalf("unexpected pinboard comparison; got %+.0f%%, %.1f cores; want about +200%%, 0.5", st.impact*100, st.onAgg.ProxyCores)
	}
	for _, c := range st.baselines {
		// Pooled: on p99s 3,000 and 4,000 (1,500 and 2,000 µs) give
		// nginx's (direct's) +100 %; round by round +100 %, then +0 %.
		if c.on.N != 2 || c.impact < 0.95 || c.impact > 1.05 || len(c.rounds) != 2 ||
			math.Abs(c.rounds[0]-1) > 0.01 || math.Abs(c.rounds[1]) > 0.01 {
			t.Fatalf("unexpected %s baseline; got %d on windows, %+.0f%%, rounds %v; want 2, +100%%, [1 0]", c.name, c.on.N, c.impact*100, c.rounds)
		}
	}
	g := goal(t, res, "Heartbeat storm: data-plane p99 impact")
	if g.Met || !strings.Contains(g.Measured, "(+200%; in the same rounds nginx +100% (pinboard's beyond it +50%), direct +100% (pinboard's beyond it +50%); the rounds of 6 windows") {
		t.Fatalf("unexpected goal; got %+v", g)
	}
	md := Markdown(res, nil, nil)
	for _, want := range []string{"| nginx | on (2 windows) |", "| direct | off (2 windows) |", "| +100% | – |", "+200% through pinboard",
		"registry costs its data plane: +50% beyond nginx's, +50% beyond direct's. Round by round, each figure from one round's four windows alone: " +
			"beyond nginx's +100%, +0%; beyond direct's +100%, +0%."} {
		if !strings.Contains(md, want) {
			t.Fatalf("storm section lacks %q:\n%s", want, md)
		}
	}
}

// TestMarkdownSaysHowRoundsCombine: a table's figure over several rounds
// is either a median of per-round figures (throughput, CPU per request)
// or a percentile of every round's requests together (latency); the
// document must say which, since the two differ in the tail.
func TestMarkdownSaysHowRoundsCombine(t *testing.T) {
	res := &Results{Rounds: 3, Machine: Machine{NProc: 2}}
	doc := Markdown(res, nil, nil)
	for _, want := range []string{
		"proxy CPU per request are medians of the rounds' figures",
		"latency percentiles are of every round's requests together",
	} {
		if !strings.Contains(strings.Join(strings.Fields(doc), " "), want) {
			t.Fatalf("unexpected markdown; got no %q; want it in the introduction", want)
		}
	}
}

// TestLargeBodiesRunBeforeIdleStreams: the idle SSE streams leave the
// proxy holding their memory, and a transfer measured after them reuses
// it (every stored run: pinboard's RSS before each transfer was its RSS
// with 9,750 streams, growth +0.0–0.1 MiB), so the large-bodies RSS goal
// could not fail. Every scenario has a step, and the steps run in the
// order of Scenarios.
func TestLargeBodiesRunBeforeIdleStreams(t *testing.T) {
	if slices.Index(Scenarios, "large") > slices.Index(Scenarios, "sse") {
		t.Fatalf("unexpected order: large bodies after SSE; got %v", Scenarios)
	}
	steps := (&runner{}).steps()
	if len(steps) != len(Scenarios) {
		t.Fatalf("unexpected steps; got %d; want %d", len(steps), len(Scenarios))
	}
	for _, name := range Scenarios {
		if steps[name] == nil {
			t.Fatalf("unexpected scenario without a step: %s", name)
		}
	}
}

// TestStormSplitKeptApartFromStorm: storm-split's windows (the storm aimed
// at a registry node on Redis, the data plane through another node) are
// judged on the data node against the registry node and the baselines in
// the same rounds, and never mix with the storm scenario's: each has its
// own goal row and section, and a storm phase that names no scenario
// (results written before storm-split) is the storm scenario's.
func TestStormSplitKeptApartFromStorm(t *testing.T) {
	window := func(res *Results, scn, target, phase string, round int, p99us float64) {
		h := bench.NewHist()
		h.RecordN(int64(p99us*1000), 100)
		res.add(&Record{Scenario: scn, Target: target, Phase: phase, Round: round, ProxyCores: 0.2,
			Summary: bench.Summary{Rate: 500, RPS: 500, OK: 100, LatHist: bench.BucketsOf(h), Latency: bench.Percentiles{P99: p99us}}})
		name := scn
		if scn == "storm" {
			name = "" // as stored before storm-split
		}
		ack := bench.NewHist()
		ack.RecordN(int64(map[string]float64{"storm": 20, "storm-split": 80}[scn]*1e6), 10)
		res.Storm = append(res.Storm, StormPhase{Scenario: name, Round: round, On: phase == "storm-on", Workers: 10000,
			Acks: fleet.Snapshot{Heartbeats: 10, AckHist: bench.BucketsOf(ack)}})
	}
	res := &Results{Rounds: 1}
	window(res, "storm", pinboard, "storm-on", 1, 6000)
	window(res, "storm", pinboard, "storm-off", 1, 2000)
	window(res, "storm", direct, "storm-on", 1, 3000)
	window(res, "storm", direct, "storm-off", 1, 2000)
	window(res, "storm-split", dataNode, "storm-on", 1, 3300)
	window(res, "storm-split", dataNode, "storm-off", 1, 2000)
	window(res, "storm-split", registryNode, "storm-on", 1, 8000)
	window(res, "storm-split", registryNode, "storm-off", 1, 2000)
	// direct's storm-split windows differ from its storm ones: a baseline
	// read across both scenarios would move both goals' figures.
	window(res, "storm-split", direct, "storm-on", 1, 3600)
	window(res, "storm-split", direct, "storm-off", 1, 2000)

	st := stormSummary(res)
	if st.phasesOn != 2 || st.onAgg.N != 1 || len(st.baselines) != 1 || math.Abs(st.impact-2) > 0.01 || st.ack.P99 > 30_000 {
		t.Fatalf("storm mixed with storm-split; got %d on phases, %d on windows, %d baselines, %+.0f%%, ack p99 %.0f µs; want 2, 1, 1, +200%%, 20 ms",
			st.phasesOn, st.onAgg.N, len(st.baselines), st.impact*100, st.ack.P99)
	}
	sp := stormSummaryOf(res, stormSplit)
	if sp.phasesOn != 3 || sp.primary != dataNode || len(sp.baselines) != 2 || math.Abs(sp.impact-0.65) > 0.01 || sp.ack.P99 < 70_000 {
		t.Fatalf("unexpected storm-split summary; got %d on phases, primary %s, %d baselines, %+.0f%%, ack p99 %.0f µs; want 3, %s, 2, +65%%, 80 ms",
			sp.phasesOn, sp.primary, len(sp.baselines), sp.impact*100, sp.ack.P99, dataNode)
	}
	g := goal(t, res, "Heartbeat storm, registry on a node of its own on the same CPUs (Redis)")
	if g.Met || !g.Known || !strings.Contains(g.Measured, "(+65%; in the same rounds pinboard-registry +300% (pinboard-data's beyond it -59%), direct +80% (pinboard-data's beyond it -8%)); acks p99 ") {
		t.Fatalf("unexpected storm-split goal; got %+v", g)
	}
	if g := goal(t, res, "Heartbeat storm: data-plane p99 impact"); !strings.Contains(g.Measured, "(+200%; in the same rounds direct +50% (pinboard's beyond it +100%))") {
		t.Fatalf("unexpected storm goal; got %+v", g)
	}
	md := Markdown(res, nil, nil)
	for _, want := range []string{"## Heartbeat storm, registry on a node of its own on the same CPUs (Redis store)", "| pinboard-data | on (1 window) |",
		"+65% through the data node", "-59% beyond pinboard-registry's, -8% beyond direct's"} {
		if !strings.Contains(md, want) {
			t.Fatalf("storm-split section lacks %q:\n%s", want, md)
		}
	}

	// The goal can be met: the data node within 10% of its storm-off p99.
	res = &Results{Rounds: 1}
	window(res, "storm-split", dataNode, "storm-on", 1, 2100)
	window(res, "storm-split", dataNode, "storm-off", 1, 2000)
	if g := goal(t, res, "Heartbeat storm, registry on a node of its own on the same CPUs (Redis)"); !g.Met || !g.Known {
		t.Fatalf("unexpected storm-split goal at +5%%; got %+v; want met", g)
	}

	// Without storm-split, no goal row for it: a run without Redis does
	// not list a goal it could not measure.
	res = &Results{Rounds: 1}
	window(res, "storm", pinboard, "storm-on", 1, 6000)
	window(res, "storm", pinboard, "storm-off", 1, 2000)
	for _, g := range Goals(res) {
		if strings.Contains(g.Name, "node of its own") {
			t.Fatalf("storm-split goal without the scenario: %+v", g)
		}
	}
}

// A phase run under other load is measured again, at most maxRepeats
// times and within the budget, and the attempt with the least other load
// is the one recorded; a quiet phase, the churn's and the storm's run once.
func TestMeasureRepeatsLoudPhases(t *testing.T) {
	for _, tc := range []struct {
		name      string
		loads     []float64
		steals    []float64 // each attempt's steal at its peak; none: 0
		budget    time.Duration
		noRepeat  bool
		attempts  int
		kept      float64
		keptSteal float64
	}{
		{"quiet at once", []float64{0.05}, nil, time.Minute, false, 1, 0.05, 0},
		{"quiet on the second", []float64{0.6, 0.1}, nil, time.Minute, false, 2, 0.1, 0},
		{"loud throughout", []float64{0.6, 0.4, 0.9, 0.01}, nil, time.Minute, false, 3, 0.4, 0},
		{"budget spent", []float64{0.6, 0.4}, nil, 0, false, 1, 0.6, 0},
		{"budget spent on the way", []float64{0.6, 0.5, 0.1}, nil, 8 * time.Second, false, 2, 0.5, 0},
		{"churn", []float64{0.6, 0.1}, nil, time.Minute, true, 1, 0.6, 0},
		// A burst of steal under a quiet average: measured again.
		{"steal burst", []float64{0.05, 0.05}, []float64{0.9, 0.1}, time.Minute, false, 2, 0.05, 0.1},
		// Loud every time, by the average or by steal: the least loud
		// by either measure is kept (0.22 of 0.2 on average, under 0.3
		// of 0.2 and a steal peak of 0.8 of 0.4), not the least average.
		{"least loud by either", []float64{0.3, 0.1, 0.22}, []float64{0, 0.8, 0.3}, time.Minute, false, 3, 0.22, 0.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{res: &Results{}, log: io.Discard, repeatBudget: tc.budget, noRepeat: tc.noRepeat}
			n := 0
			r.once = func(scn, phase string, round int, _ *target, _ *bench.Loop, _ func(int) (bench.Doer, error)) (*Record, time.Duration, error) {
				rec := &Record{Scenario: scn, Phase: phase, Round: round, ForeignCores: tc.loads[n]}
				if tc.steals != nil {
					rec.StealPeak = tc.steals[n]
				}
				n++
				return rec, 8 * time.Second, nil
			}
			rec, err := r.measure("hot", "peak", 1, &target{name: "pinboard"}, &bench.Loop{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.attempts || rec.ForeignCores != tc.kept || rec.StealPeak != tc.keptSteal {
				t.Fatalf("unexpected measure; got %d attempts, kept load %v and steal %v; want %d, %v, %v", n, rec.ForeignCores, rec.StealPeak, tc.attempts, tc.kept, tc.keptSteal)
			}
			if len(r.res.Runs) != 1 || r.res.Runs[0] != rec || r.res.Repeated != tc.attempts-1 {
				t.Fatalf("unexpected results; got %d runs, %d repeated; want the kept one, %d", len(r.res.Runs), r.res.Repeated, tc.attempts-1)
			}
		})
	}
}

// A phase is quiet under both thresholds: other load on average, and
// steal over its loudest half second. Results written before steal was
// sampled have none, and are judged by the average alone.
func TestQuietByAverageAndStealPeak(t *testing.T) {
	for _, tc := range []struct {
		load, steal float64
		want        bool
	}{
		{0, 0, true}, {0.19, 0.39, true}, {0.2, 0, false}, {0, 0.4, false}, {0.05, 1.2, false}, {0.5, 0, false},
	} {
		if got := quiet(&Record{ForeignCores: tc.load, StealPeak: tc.steal}); got != tc.want {
			t.Errorf("quiet with other load %.2f and steal peak %.2f; got %v; want %v", tc.load, tc.steal, got, tc.want)
		}
	}
	var old Record
	if err := json.Unmarshal([]byte(`{"foreignCores":0.1}`), &old); err != nil || !quiet(&old) {
		t.Fatalf("unexpected reading of a record without steal; got %+v, %v; want quiet", old, err)
	}
}

// Ctrl-C during a loud phase ends it there: no repeat, nothing recorded
// (the phase was cut short), and the run's error says why.
func TestMeasureStopsWhenInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{res: &Results{}, log: io.Discard, repeatBudget: time.Minute, ctx: ctx}
	n := 0
	r.once = func(scn, phase string, round int, _ *target, _ *bench.Loop, _ func(int) (bench.Doer, error)) (*Record, time.Duration, error) {
		n++
		cancel() // the signal comes while the phase runs
		return &Record{Scenario: scn, Phase: phase, Round: round, ForeignCores: 0.9}, 8 * time.Second, nil
	}
	rec, err := r.measure("hot", "peak", 1, &target{name: "pinboard"}, &bench.Loop{}, nil)
	if !errors.Is(err, context.Canceled) || rec != nil {
		t.Fatalf("unexpected measure of an interrupted phase; got %v, %v; want context.Canceled", rec, err)
	}
	if n != 1 || len(r.res.Runs) != 0 || r.res.Repeated != 0 {
		t.Fatalf("unexpected attempts after the interruption; got %d attempts, %d runs recorded, %d repeated; want 1, 0, 0", n, len(r.res.Runs), r.res.Repeated)
	}
}

// A cold phase measured again sends ids of its own: those of the first
// attempt are placed already, and would measure hot placements.
func TestColdDoersNewIdsPerAttempt(t *testing.T) {
	paths := make(chan string, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { paths <- r.URL.Path }))
	defer srv.Close()
	rt := newRoute(&target{name: "pinboard", addrs: []string{strings.TrimPrefix(srv.URL, "http://")}}, nil)
	mk := rt.coldDoers("/cold", "1p", "json")
	attempt := func() string {
		var doers []bench.Doer
		for w := range 3 { // a loop makes its workers' doers in order
			d, err := mk(w)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			doers = append(doers, d)
		}
		if err := doers[2].Do(5); err != nil {
			t.Fatal(err)
		}
		return <-paths
	}
	if got, want := attempt(), "/cold/c1p-5/json"; got != want {
		t.Fatalf("unexpected first attempt's request; got %q; want %q", got, want)
	}
	if got, want := attempt(), "/cold/c1p.2-5/json"; got != want {
		t.Fatalf("unexpected second attempt's request; got %q; want %q", got, want)
	}
}

// TestHotTablesShowTheRelays: the relays' rows sit between nginx and
// pinboard in both hot-ids tables, with the note saying what they are;
// results without them (runs before the relays, other scenarios) render
// neither rows nor note.
func TestHotTablesShowTheRelays(t *testing.T) {
	res := &Results{Rounds: 1, Machine: Machine{NProc: 2}}
	h := bench.NewHist()
	h.RecordN(500_000, 10)
	for _, name := range []string{direct, nginx, pinboard} {
		for _, phase := range []string{"peak", "latency"} {
			res.add(&Record{Scenario: "hot", Target: name, Phase: phase, Round: 1,
				Summary: bench.Summary{Rate: 3000, RPS: 1000, OK: 10, LatHist: bench.BucketsOf(h)}})
		}
	}
	without := Markdown(res, nil, nil)
	if strings.Contains(without, "relay") {
		t.Fatal("unexpected relay rows, note or introduction in a run without relays")
	}
	for _, name := range []string{relayGoroutine, relayEpoll} {
		for _, phase := range []string{"peak", "latency"} {
			res.add(&Record{Scenario: "hot", Target: name, Phase: phase, Round: 1,
				Summary: bench.Summary{Rate: 3000, RPS: 900, OK: 10, LatHist: bench.BucketsOf(h)}})
		}
	}
	doc := Markdown(res, nil, nil)
	if !strings.Contains(doc, "two more targets beside them, Go relays") || !strings.Contains(doc, "rotation moved one place a round") {
		t.Fatal("unexpected introduction; got no word of the relays or of the old rotation")
	}
	res.fact("hot.order", "spread")
	if spread := Markdown(throughJSON(t, res), nil, nil); !strings.Contains(spread, "no\ntarget keeps its place") || strings.Contains(spread, "moved one place") {
		t.Fatal("unexpected introduction of a run with the spread rotation")
	}
	hot := doc[strings.Index(doc, "## Hot ids"):]
	hot = hot[:strings.Index(hot[1:], "\n## ")+1]
	if !strings.Contains(hot, "floors, not proxies") {
		t.Fatal("unexpected hot-ids section; got no note on the relays")
	}
	var rows []string
	for _, line := range strings.Split(hot, "\n") {
		if name, _, ok := strings.Cut(strings.TrimPrefix(line, "| "), " |"); ok && strings.HasPrefix(line, "| ") && name != "target" {
			rows = append(rows, name)
		}
	}
	want := "direct nginx relay-goroutine relay-epoll pinboard"
	if got := strings.Join(rows, " "); got != want+" "+want {
		t.Fatalf("unexpected rows in the hot-ids tables; got %q; want %q in each", got, want)
	}
}
