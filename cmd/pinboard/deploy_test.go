package main

// The deployment files in deploy/ (and the README's production command)
// are checked against this binary: every
// variable they set is one pinboard reads, their configuration loads, the
// probes they point an orchestrator at answer on the port they name, and
// the numbers that must agree across files (ports, the shutdown budget,
// the configuration-error exit code, the image's user) do. A renamed
// variable or a changed default then fails here instead of in a cluster.
// docs/OPERATIONS.md ("Deployment files") says what is checked and what
// cannot be here (no Docker engine, no Kubernetes API server).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/server"
)

// childEnv makes the test binary run pinboard's main instead of the tests,
// so a test starts the real binary with exactly the environment a
// deployment file gives it.
const childEnv = "PINBOARD_TEST_RUN_AS_BINARY"

// crashEnv makes the test binary crash as a Go program does on an
// unrecovered panic, to learn the exit status systemd then sees.
const crashEnv = "PINBOARD_TEST_CRASH"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(run(nil, os.LookupEnv, os.Stderr))
	}
	if os.Getenv(crashEnv) == "1" {
		go func() { panic("crash for TestSystemdRestartsAfterCrash_RSRV2") }()
		select {}
	}
	os.Exit(m.Run())
}

const deployDir = "../../deploy"

// readVars returns the variables loadConfig reads (it reads every one,
// set or not) plus the passport's token variables.
func readVars(t *testing.T, kv map[string]string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	lookup := func(k string) (string, bool) {
		seen[k] = true
		v, ok := kv[k]
		return v, ok
	}
	if _, err := loadConfig(lookup); err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	return seen
}

// goRuntimeVars are the Go runtime's settings a deployment file may set
// beside pinboard's own.
var goRuntimeVars = map[string]bool{"GOMEMLIMIT": true, "GOGC": true, "GOMAXPROCS": true, "GODEBUG": true}

// checkKnown fails for every variable in kv that pinboard (or the Go
// runtime) does not read.
func checkKnown(t *testing.T, file string, kv map[string]string) {
	t.Helper()
	known := readVars(t, kv)
	for k := range kv {
		if !known[k] && !goRuntimeVars[k] {
			t.Errorf("%s sets %s, which pinboard does not read (a typo, or a variable renamed?)", file, k)
		}
	}
}

// loadFrom runs loadConfig over kv, failing the test on an error.
func loadFrom(t *testing.T, file string, kv map[string]string) *config {
	t.Helper()
	cfg, err := loadConfig(env(kv))
	if err != nil {
		t.Fatalf("the configuration in %s does not load: %v", file, err)
	}
	return cfg
}

// Every variable loadConfig reads is in OPERATIONS.md's table, and every
// variable the table lists is read (R-SRV-2, R-SRV-3).
func TestOperationsTableListsEveryVariable_RSRV3(t *testing.T) {
	read := readVars(t, base())
	delete(read, "PINBOARD_TOKEN") // the passport's token.env, not a setting
	doc, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	// Rows of the environment table: "| `NAME` | default | meaning |",
	// or several names in the first cell.
	row := regexp.MustCompile("(?m)^\\| (`[A-Z][A-Z0-9_]*`(?:, `[A-Z][A-Z0-9_]*`)*) \\|")
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
	listed := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		for _, n := range name.FindAllStringSubmatch(m[1], -1) {
			listed[n[1]] = true
		}
	}
	// Read by Go's crypto/x509, not by loadConfig; documented for rediss://.
	goOwn := []string{"SSL_CERT_FILE", "SSL_CERT_DIR"}
	for k := range read {
		if !listed[k] {
			t.Errorf("pinboard reads %s but docs/OPERATIONS.md's table does not list it", k)
		}
	}
	for k := range listed {
		if !read[k] && !slices.Contains(goOwn, k) {
			t.Errorf("docs/OPERATIONS.md lists %s, which pinboard does not read", k)
		}
	}
	if len(listed) < 20 {
		t.Fatalf("found only %d variables in docs/OPERATIONS.md: has the table's format changed?", len(listed))
	}
}

// ---- Kubernetes ----------------------------------------------------------

// yamlDocs decodes every document of a multi-document YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs []map[string]any
	dec := yaml.NewDecoder(f)
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

// dig walks maps by string keys and slices by int indices; nil when a
// step is missing.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// object finds the document of kind and name.
func object(t *testing.T, docs []map[string]any, kind, name string) map[string]any {
	t.Helper()
	for _, d := range docs {
		if str(d["kind"]) == kind && str(dig(d, "metadata", "name")) == name {
			return d
		}
	}
	t.Fatalf("no %s %q in the manifests", kind, name)
	return nil
}

// stringMap converts a YAML mapping of strings.
func stringMap(t *testing.T, v any, what string) map[string]string {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s is not a mapping", what)
	}
	out := map[string]string{}
	for k, x := range m {
		s, ok := x.(string)
		if !ok {
			t.Fatalf("%s.%s is %T, not a string (Kubernetes refuses it)", what, k, x)
		}
		out[k] = s
	}
	return out
}

// containerPort returns the port named name in the container.
func containerPort(c any, name string) int {
	for _, p := range asSlice(dig(c, "ports")) {
		if str(dig(p, "name")) == name {
			n, _ := dig(p, "containerPort").(int)
			return n
		}
	}
	return 0
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func portOf(t *testing.T, hostport, what string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("%s %q: %v", what, hostport, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s %q: %v", what, hostport, err)
	}
	return n
}

// The Kubernetes manifests configure a pinboard that starts, answers its
// probes on the ports they name, and fits its shutdown in the pod's
// termination budget (R-SRV-2, R-SRV-3; docs/OPERATIONS.md).
func TestKubernetesManifests_RSRV3(t *testing.T) {
	dir := filepath.Join(deployDir, "kubernetes")
	docs := yamlDocs(t, filepath.Join(dir, "pinboard.yaml"))
	redisDocs := yamlDocs(t, filepath.Join(dir, "redis.yaml"))

	kust := yamlDocs(t, filepath.Join(dir, "kustomization.yaml"))
	for _, r := range asSlice(dig(kust[0], "resources")) {
		if _, err := os.Stat(filepath.Join(dir, str(r))); err != nil {
			t.Errorf("kustomization.yaml lists %v: %v", r, err)
		}
	}

	dep := object(t, docs, "Deployment", "pinboard")
	pod := dig(dep, "spec", "template")
	podLabels := stringMap(t, dig(pod, "metadata", "labels"), "pod labels")
	matches := func(sel any, what string) {
		for k, v := range stringMap(t, sel, what) {
			if podLabels[k] != v {
				t.Errorf("%s selects %s=%s; the pod template's labels are %v", what, k, v, podLabels)
			}
		}
	}
	matches(dig(dep, "spec", "selector", "matchLabels"), "the Deployment's selector")
	matches(dig(object(t, docs, "PodDisruptionBudget", "pinboard"), "spec", "selector", "matchLabels"), "the PodDisruptionBudget")
	svc := object(t, docs, "Service", "pinboard")
	matches(dig(svc, "spec", "selector"), "the Service")

	c := dig(pod, "spec", "containers", 0)
	// The container's environment, as the kubelet assembles it: envFrom
	// first, then env.
	kv := map[string]string{}
	for _, from := range asSlice(dig(c, "envFrom")) {
		switch {
		case dig(from, "configMapRef") != nil:
			cm := object(t, docs, "ConfigMap", str(dig(from, "configMapRef", "name")))
			for k, v := range stringMap(t, cm["data"], "the ConfigMap's data") {
				kv[k] = v
			}
		case dig(from, "secretRef") != nil:
			sec := object(t, docs, "Secret", str(dig(from, "secretRef", "name")))
			for k, v := range stringMap(t, sec["stringData"], "the Secret's stringData") {
				kv[k] = v
			}
		}
	}
	for _, e := range asSlice(dig(c, "env")) {
		v, ok := dig(e, "value").(string)
		if !ok {
			t.Fatalf("env %v: the value must be a string", dig(e, "name"))
		}
		kv[str(dig(e, "name"))] = v
	}
	const file = "deploy/kubernetes/pinboard.yaml"
	checkKnown(t, file, kv)
	cfg := loadFrom(t, file, kv)

	// GOMEMLIMIT, in the runtime's own syntax, leaves the collector room
	// below the container's memory limit: at or above it the container is
	// OOM-killed before the soft limit does anything.
	limit := quantityBytes(t, str(dig(c, "resources", "limits", "memory")))
	if soft := goMemLimit(t, kv["GOMEMLIMIT"]); soft <= 0 || soft > limit*95/100 {
		t.Errorf("GOMEMLIMIT=%q is %d bytes; want set, at most 95%% of limits.memory (%d bytes)", kv["GOMEMLIMIT"], soft, limit)
	}

	// Ports: the container's named ports are the ones pinboard listens on.
	if got, want := containerPort(c, "http"), portOf(t, cfg.Addr, "PORT"); got != want {
		t.Errorf("container port http is %d, PORT is %d", got, want)
	}
	if cfg.MetricsAddr == "" {
		t.Fatal("PINBOARD_METRICS_ADDR is not set: the probes need the admin listener")
	}
	if got, want := containerPort(c, "admin"), portOf(t, cfg.MetricsAddr, "PINBOARD_METRICS_ADDR"); got != want {
		t.Errorf("container port admin is %d, PINBOARD_METRICS_ADDR's port is %d", got, want)
	}
	for _, p := range asSlice(dig(svc, "spec", "ports")) {
		if containerPort(c, str(dig(p, "targetPort"))) == 0 {
			t.Errorf("the Service targets port %v, which the container does not name", dig(p, "targetPort"))
		}
	}

	// REDIS_URL reaches the example Redis's Service.
	u, err := url.Parse(cfg.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	rsvc := object(t, redisDocs, "Service", u.Hostname())
	if got := str(dig(rsvc, "spec", "ports", 0, "port")); got != u.Port() {
		t.Errorf("REDIS_URL's port is %s, the redis Service's is %s", u.Port(), got)
	}

	// The image runs as distroless's nonroot user (deploy/Dockerfile).
	if got := dig(pod, "spec", "securityContext", "runAsUser"); got != 65532 {
		t.Errorf("runAsUser is %v, the image's nonroot user is 65532", got)
	}

	// Shutdown budget: the preStop sleep, the shutdown delay, the grace, and
	// server.CloseWait for the streams' closing must fit before the kubelet's SIGKILL.
	preStop, _ := dig(c, "lifecycle", "preStop", "sleep", "seconds").(int)
	budget, _ := dig(pod, "spec", "terminationGracePeriodSeconds").(int)
	need := time.Duration(preStop)*time.Second + cfg.Delay + cfg.Grace + server.CloseWait
	if time.Duration(budget)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %d is not more than preStop %ds + delay %v + grace %v + %v", budget, preStop, cfg.Delay, cfg.Grace, server.CloseWait)
	}

	// The probes: on the admin port, at paths that answer 200 on a
	// started pinboard with this very environment (the store made local).
	probes := map[string]string{}
	for _, name := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
		p := dig(c, name, "httpGet")
		if p == nil {
			t.Errorf("%s: no httpGet probe", name)
			continue
		}
		if got := str(dig(p, "port")); got != "admin" {
			t.Errorf("%s is on port %q; the admin listener keeps answering during a shutdown, the public one does not", name, got)
		}
		probes[name] = str(dig(p, "path"))
	}
	kv["REDIS_URL"] = "memory:"
	admin, public := startBinary(t, kv)
	for name, path := range probes {
		if code, body := get(t, "http://"+admin+path); code != http.StatusOK {
			t.Errorf("%s GET %s: %d %s", name, path, code, body)
		}
	}
	// The readiness the Service routes by must hold through the cold-start
	// quarantine, which every node shares: workers re-register through
	// that Service during it (docs/OPERATIONS.md, "Health endpoints").
	if code, _ := get(t, "http://"+public+"/counters/alice/value"); code != http.StatusServiceUnavailable {
		t.Fatalf("the first placement did not start the quarantine: %d", code)
	}
	if code, body := get(t, "http://"+admin+probes["readinessProbe"]); code != http.StatusOK {
		t.Errorf("readinessProbe during the cold-start quarantine: %d %s; the Service would lose every node at once", code, body)
	}
}

// ---- systemd -------------------------------------------------------------

// envFile parses a systemd EnvironmentFile: KEY=VALUE lines, # and ;
// comments, a value in single or double quotes taken as it is inside.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s:%d: not KEY=VALUE: %q", path, n, line)
		}
		if len(v) >= 2 && (v[0] == '\'' || v[0] == '"') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		kv[strings.TrimSpace(k)] = v
	}
	return kv
}

// unitKeys returns the [Service] section's keys (the last value of each).
func unitKeys(t *testing.T, path string) map[string]string {
	t.Helper()
	return unitSection(t, path, "[Service]")
}

// unitSection returns the keys of one section of a systemd unit file.
func unitSection(t *testing.T, path, want string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = line
		case section == want:
			k, v, _ := strings.Cut(line, "=")
			keys[k] = v
		}
	}
	return keys
}

// The systemd unit and its environment file configure a pinboard that
// starts and fits its shutdown in TimeoutStopSec; systemd itself accepts
// the unit (R-SRV-2, R-SRV-3; docs/OPERATIONS.md).
func TestSystemdUnit_RSRV2(t *testing.T) {
	dir := filepath.Join(deployDir, "systemd")
	const file = "deploy/systemd/pinboard.env.example"
	kv := envFile(t, filepath.Join(dir, "pinboard.env.example"))
	checkKnown(t, file, kv)
	cfg := loadFrom(t, file, kv)

	unit := unitKeys(t, filepath.Join(dir, "pinboard.service"))
	if got := unit["ExecStart"]; got != "/usr/local/bin/pinboard" {
		t.Errorf("ExecStart=%s; the unit's install notes put the binary at /usr/local/bin/pinboard", got)
	}
	if got := unit["EnvironmentFile"]; got != "/etc/pinboard/pinboard.env" {
		t.Errorf("EnvironmentFile=%s; the environment file's header says /etc/pinboard/pinboard.env", got)
	}
	if got := unit["KillSignal"]; got != "SIGTERM" {
		t.Errorf("KillSignal=%s; the graceful shutdown starts on SIGTERM", got)
	}
	stop, err := strconv.Atoi(strings.TrimSuffix(unit["TimeoutStopSec"], "s"))
	if err != nil {
		t.Fatalf("TimeoutStopSec=%q: %v", unit["TimeoutStopSec"], err)
	}
	if time.Duration(stop)*time.Second <= cfg.Delay+cfg.Grace+server.CloseWait {
		t.Errorf("TimeoutStopSec=%d is not more than delay %v + grace %v + %v", stop, cfg.Delay, cfg.Grace, server.CloseWait)
	}
	if code := run(nil, env(map[string]string{}), io.Discard); code != 2 {
		t.Errorf("a configuration error exits %d; docs/OPERATIONS.md says 2", code)
	}

	// systemd's own check, with the paths pointed at files that exist
	// here; it prints a line for anything it does not accept (an unknown
	// key exits 0 with a warning, so any output fails).
	if sa, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Logf("systemd-analyze not installed: the unit was not verified by systemd")
	} else {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.ReadFile(filepath.Join(dir, "pinboard.service"))
		if err != nil {
			t.Fatal(err)
		}
		envPath, _ := filepath.Abs(filepath.Join(dir, "pinboard.env.example"))
		s := strings.Replace(string(src), "ExecStart=/usr/local/bin/pinboard", "ExecStart="+exe, 1)
		s = strings.Replace(s, "EnvironmentFile=/etc/pinboard/pinboard.env", "EnvironmentFile="+envPath, 1)
		tmp := filepath.Join(t.TempDir(), "pinboard.service")
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(sa, "verify", tmp).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	// The binary starts with this environment (the store made local, the
	// ports free) and answers on the admin listener it configures.
	kv["REDIS_URL"] = "memory:"
	admin, _ := startBinary(t, kv)
	for _, path := range []string{"/livez", "/readyz"} {
		if code, body := get(t, "http://"+admin+path); code != http.StatusOK {
			t.Errorf("GET %s: %d %s", path, code, body)
		}
	}
}

// ---- Docker --------------------------------------------------------------

// The Dockerfile builds the commands that exist, with the Go release
// go.mod names, exposes the ports its environment configures, and runs
// as the user the Kubernetes manifest expects. The image is not built
// here (no Docker engine): docs/OPERATIONS.md.
func TestDockerfile_RSRV3(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	// The build stage's Go is go.mod's release.
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))
	from := regexp.MustCompile(`(?m)^FROM golang:(\d+\.\d+)\S* AS build`).FindStringSubmatch(src)
	if goLine == nil || from == nil || goLine[1] != from[1] {
		t.Errorf("the build stage's Go (%v) is not go.mod's (%v)", from, goLine)
	}
	// Every package built exists.
	for _, m := range regexp.MustCompile(`go build[^\n]*?(\./cmd/\S+)`).FindAllStringSubmatch(strings.ReplaceAll(src, "\\\n", " "), -1) {
		if _, err := os.Stat(filepath.Join("../..", m[1], "main.go")); err != nil {
			t.Errorf("the Dockerfile builds %s: %v", m[1], err)
		}
	}
	// ENV: known variables; with a passport they load; EXPOSE matches.
	kv := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^ENV (.+)$`).FindAllStringSubmatch(src, -1) {
		for _, f := range strings.Fields(m[1]) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				t.Fatalf("ENV %q: use KEY=VALUE", f)
			}
			kv[k] = v
		}
	}
	const file = "deploy/Dockerfile"
	for k, v := range base() {
		if _, set := kv[k]; !set {
			kv[k] = v
		}
	}
	checkKnown(t, file, kv)
	cfg := loadFrom(t, file, kv)
	var exposed []int
	for _, m := range regexp.MustCompile(`(?m)^EXPOSE (.+)$`).FindAllStringSubmatch(src, -1) {
		for _, f := range strings.Fields(m[1]) {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("EXPOSE %q: %v", f, err)
			}
			exposed = append(exposed, n)
		}
	}
	for _, want := range []int{portOf(t, cfg.Addr, "PORT"), portOf(t, cfg.MetricsAddr, "PINBOARD_METRICS_ADDR")} {
		if !slices.Contains(exposed, want) {
			t.Errorf("the image listens on %d but EXPOSE says %v", want, exposed)
		}
	}
	// The user is numeric: for a name ("nonroot", which the base image
	// itself sets as 65532) the kubelet cannot check runAsNonRoot and
	// refuses to start the container ("image has non-numeric user") in
	// any pod that does not also set runAsUser.
	users := regexp.MustCompile(`(?m)^USER (.+)$`).FindAllStringSubmatch(src, -1)
	if len(users) == 0 || !strings.Contains(src, "distroless/static-debian12:nonroot") {
		t.Error("the image must run as distroless's nonroot (uid 65532), as the Kubernetes manifest's runAsUser says")
	} else if u := strings.TrimSpace(users[len(users)-1][1]); !regexp.MustCompile(`^65532(:65532)?$`).MatchString(u) {
		t.Errorf("USER %s; want the numeric 65532:65532 (distroless's nonroot), so that runAsNonRoot can verify it without runAsUser", u)
	}
	if !regexp.MustCompile(`(?m)^ENTRYPOINT \["/usr/local/bin/pinboard"\]$`).MatchString(src) {
		t.Error("ENTRYPOINT is not the copied /usr/local/bin/pinboard")
	}
}

// ---- the binary ------------------------------------------------------------

// startBinary starts pinboard (this test binary in its main mode) with kv
// as its whole environment, the public and admin listeners moved to free
// loopback ports, waits until the admin listener answers, and stops it
// with SIGTERM at the end of the test, expecting exit 0. It returns the
// admin and public addresses. A port freePort found can be taken by
// another process before pinboard binds it (packages test in parallel):
// on a bind failure it starts again on fresh ports, three times at most.
func startBinary(t *testing.T, kv map[string]string) (admin, public string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		admin, public, out, err := tryStartBinary(t, kv)
		if err == nil {
			return admin, public
		}
		if attempt < 3 && strings.Contains(out, "address already in use") {
			t.Logf("pinboard could not bind its ports (attempt %d): %v; trying fresh ones", attempt, err)
			continue
		}
		t.Fatalf("%v\n%s", err, out)
	}
}

// A SIGTERM as soon as the listeners accept is a graceful shutdown, exit
// 0: the handler is in place before the first listener opens. It was
// installed after both, and a stop right after start (startBinary's, once
// the admin listener answered) now and then killed the process with the
// signal's default action on a loaded machine. Each round stops the
// binary the moment its admin listener accepts (startBinary's cleanup);
// the window was short, so the rounds make it likely to be hit (R-SRV-2).
func TestSIGTERMRightAfterStartIsGraceful_RSRV2(t *testing.T) {
	kv := envFile(t, filepath.Join(deployDir, "systemd", "pinboard.env.example"))
	kv["REDIS_URL"] = "memory:"
	for i := range 10 {
		t.Run(strconv.Itoa(i), func(t *testing.T) { startBinary(t, kv) })
	}
}

// tryStartBinary is one attempt of startBinary: on failure it returns the
// error and pinboard's output, the process gone.
func tryStartBinary(t *testing.T, kv map[string]string) (admin, public, output string, err error) {
	t.Helper()
	publicPort, adminPort := freePort(t), freePort(t)
	envv := []string{childEnv + "=1", "HOST=127.0.0.1", "PORT=" + strconv.Itoa(publicPort),
		"PINBOARD_METRICS_ADDR=127.0.0.1:" + strconv.Itoa(adminPort)}
	for k, v := range kv {
		switch k {
		case "HOST", "PORT", "PINBOARD_METRICS_ADDR":
		default:
			envv = append(envv, k+"="+v)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = envv
	out := &testlog.Buffer{} // the child's output, read while it runs
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	addr := "127.0.0.1:" + strconv.Itoa(adminPort)
	public = "127.0.0.1:" + strconv.Itoa(publicPort)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-done:
			return "", "", out.String(), fmt.Errorf("pinboard exited at start-up: %v", err)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return "", "", out.String(), fmt.Errorf("pinboard's admin listener %s did not open within 10 s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("pinboard did not exit 0 after SIGTERM: %v\n%s", err, out.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("pinboard did not stop within 15 s of SIGTERM\n%s", out.String())
		}
	})
	return addr, public, "", nil
}

// quantityBytes reads a Kubernetes memory quantity in binary units
// (512Mi).
func quantityBytes(t *testing.T, q string) int64 {
	t.Helper()
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}} {
		if n, ok := strings.CutSuffix(q, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				t.Fatalf("cannot parse memory quantity %q: %v", q, err)
			}
			return v * u.mult
		}
	}
	t.Fatalf("unexpected memory quantity %q; want Ki, Mi or Gi", q)
	return 0
}

// goMemLimit reads GOMEMLIMIT as the runtime does: digits and an
// optional B, KiB, MiB, GiB or TiB (runtime.parseByteCount); 0 if unset.
func goMemLimit(t *testing.T, s string) int64 {
	t.Helper()
	if s == "" {
		return 0
	}
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		t.Fatalf("GOMEMLIMIT=%q is not one the Go runtime reads", s)
	}
	return v * mult
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The README's "Run it for real" command sets variables pinboard reads,
// and its passport loads: it is the first configuration most operators
// copy (R-SRV-2).
func TestReadmeConfiguration_RSRV2(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "## Run it for real")
	if !ok {
		t.Fatal(`README.md has no "## Run it for real" section`)
	}
	_, block, ok := strings.Cut(after, "```sh\n")
	if ok {
		block, _, ok = strings.Cut(block, "```")
	}
	if !ok {
		t.Fatal(`"## Run it for real" has no sh block`)
	}
	// NAME='value' or NAME=value, up to the command.
	assign := regexp.MustCompile(`([A-Z][A-Z0-9_]*)=('[^']*'|\S+)`)
	kv := map[string]string{}
	for _, m := range assign.FindAllStringSubmatch(strings.ReplaceAll(block, "\\\n", " "), -1) {
		kv[m[1]] = strings.Trim(m[2], "'")
	}
	if kv["PINBOARD_PASSPORT"] == "" || kv["REDIS_URL"] == "" {
		t.Fatalf("found %v in the README's command: want at least PINBOARD_PASSPORT and REDIS_URL", kv)
	}
	checkKnown(t, "README.md", kv)
	loadFrom(t, "README.md", kv)
}

// make test installs redis-server from Debian's packages on a fresh
// machine, as root (CI, containers) or as a user with sudo; make bench
// installs nginx-light the same way. Each recipe runs here with a PATH of
// stand-ins: no redis-server, an id that says who we are, and an apt-get
// (and sudo) that record how they were called. A fresh root machine once
// failed here: an empty $SUDO left DEBIAN_FRONTEND=… as the command name.
func TestMakeInstallsDebianPackages(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make on PATH")
	}
	envBin, err := exec.LookPath("env")
	if err != nil {
		t.Fatal(err)
	}
	chmodBin, err := exec.LookPath("chmod")
	if err != nil {
		t.Fatal(err)
	}
	recipes := []struct{ target, pkg string }{{"deps-redis", "redis-server"}}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		// bench-deps looks there too, whatever PATH says.
		t.Log("bench-deps not run: /usr/sbin/nginx is installed")
	} else {
		recipes = append(recipes, struct{ target, pkg string }{"bench-deps", "nginx-light"})
	}
	for _, r := range recipes {
		for _, uid := range []string{"0", "1000"} {
			t.Run(r.target+"/uid"+uid, func(t *testing.T) {
				dir := t.TempDir()
				log := filepath.Join(dir, "calls.log")
				script := func(name, body string) {
					t.Helper()
					if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/bash\n"+body+"\n"), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				script("id", "echo "+uid)
				// Like sudo(8), leading NAME=value arguments set the
				// command's environment.
				script("sudo", `echo "sudo $*" >>`+log+`
while [[ $1 == [A-Z]*=* ]]; do export "$1"; shift; done
exec "$@"`)
				// apt-get "installs" stand-ins for what the recipes
				// check for afterwards.
				script("apt-get", `echo "apt-get DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >>`+log+`
for b in redis-server redis-cli taskset; do printf '#!/bin/bash\necho stand-in\n' >`+dir+`/$b; `+chmodBin+` +x `+dir+`/$b; done`)
				if err := os.Symlink(envBin, filepath.Join(dir, "env")); err != nil {
					t.Fatal(err)
				}
				if r.target == "bench-deps" {
					script("taskset", "true")
				}
				cmd := exec.Command(makeBin, "-s", "-C", "../..", r.target)
				cmd.Env = []string{"PATH=" + dir, "HOME=" + dir}
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("make %s as uid %s: %v\n%s", r.target, uid, err, out)
				}
				calls, err := os.ReadFile(log)
				if err != nil {
					t.Fatalf("make %s as uid %s called no apt-get: %v\n%s", r.target, uid, err, out)
				}
				want := "apt-get DEBIAN_FRONTEND=noninteractive install -y -qq " + r.pkg
				if !strings.Contains(string(calls), want) {
					t.Errorf("make %s as uid %s: calls\n%s\nwant a line %q", r.target, uid, calls, want)
				}
				if sudo := strings.Contains(string(calls), "sudo "); sudo != (uid != "0") {
					t.Errorf("make %s as uid %s: sudo used = %v\n%s", r.target, uid, sudo, calls)
				}
			})
		}
	}
}

// make run prints the URL workers and operators use. It always said
// 127.0.0.1, which nothing listens on once RUN_HOST names another
// address (README.md: "make run PORT=… RUN_HOST=…"): the printed
// commands were refused. It names RUN_HOST, loopback for all interfaces.
func TestMakeRunPrintsListenURL_RSRV3(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make on PATH")
	}
	for host, want := range map[string]string{
		"127.0.0.1": "http://127.0.0.1:18080",
		"0.0.0.0":   "http://127.0.0.1:18080",
		"::":        "http://127.0.0.1:18080",
		"":          "http://127.0.0.1:18080",
		"::1":       "http://[::1]:18080",
		"10.1.2.3":  "http://10.1.2.3:18080",
		"localhost": "http://localhost:18080",
	} {
		// -n prints the recipe, echo lines included, running nothing.
		out, err := exec.Command(makeBin, "-s", "-n", "-C", "../..", "run", "RUN_HOST="+host, "PORT=18080").CombinedOutput()
		if err != nil {
			t.Fatalf("make -n run RUN_HOST=%s: %v\n%s", host, err, out)
		}
		for _, line := range []string{"PINBOARD_URL=" + want + " ", want + "/registry/workers"} {
			if !strings.Contains(string(out), line) {
				t.Errorf("unexpected make run output for RUN_HOST=%q; got\n%s\nwant a line with %q", host, out, line)
			}
		}
	}
}

// The image reports the release it was built as: deploy/Dockerfile's
// VERSION argument reaches pinboard_build_info and the "pinboard
// listening" line. It was declared and never used, and an image built
// without VCS data reported "(devel)" whatever VERSION said. The
// Dockerfile's own -ldflags for ./cmd/pinboard are built with VERSION
// set, and the binary started: an -X naming a variable that does not
// exist would be dropped by the linker without a word (R-SRV-3).
func TestDockerfileStampsVersion_RSRV3(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	src := strings.ReplaceAll(string(b), "\\\n", " ")
	if !regexp.MustCompile(`(?m)^ARG VERSION=`).MatchString(src) {
		t.Fatal("deploy/Dockerfile declares no ARG VERSION")
	}
	m := regexp.MustCompile(`go build [^\n&]*?-ldflags="([^"]*)"[^\n&]*?\./cmd/pinboard\b`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("deploy/Dockerfile has no go build -ldflags=\"…\" … ./cmd/pinboard")
	}
	const want = "9.8.7-test"
	ldflags := strings.NewReplacer("${VERSION}", want, "$VERSION", want).Replace(m[1])
	if ldflags == m[1] {
		t.Fatalf("deploy/Dockerfile's ARG VERSION does not reach pinboard's -ldflags %q", m[1])
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the binary with")
	}
	bin := filepath.Join(t.TempDir(), "pinboard")
	if out, err := exec.Command(goBin, "build", "-buildvcs=false", "-ldflags="+ldflags, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags=%q: %v\n%s", ldflags, err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"HOST=127.0.0.1", "PORT=0", "REDIS_URL=memory:"}
	for k, v := range base() {
		switch k {
		case "HOST", "PORT", "REDIS_URL", "PINBOARD_METRICS_ADDR":
		default:
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var listening string
	timeout := time.After(10 * time.Second)
	for listening == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("pinboard exited before listening")
			}
			if strings.Contains(l, `msg="pinboard listening"`) {
				listening = l
			}
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatal("pinboard did not listen within 10 s")
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("pinboard did not exit 0 after SIGTERM: %v", err)
	}
	if !strings.Contains(listening, "version="+want) {
		t.Errorf("unexpected version in %q; want version=%s (deploy/Dockerfile's VERSION)", listening, want)
	}
}

// systemd restarts pinboard after a crash, and gives up on a
// configuration error. A Go program that panics (or dies of a fatal
// runtime error) exits 2, the status pinboard gives a configuration
// error: RestartPreventExitStatus=2 left a crashed node down for good. A
// start limit stops the restarts instead: a configuration error fails at
// once, so its restarts come RestartSec apart and reach the limit within
// its interval; a start that fails on an unreachable Redis takes
// storeOpenTimeout each time and never does, so a Redis outage at boot
// does not leave the node failed (R-SRV-2).
func TestSystemdRestartsAfterCrash_RSRV2(t *testing.T) {
	path := filepath.Join(deployDir, "systemd", "pinboard.service")
	svc := unitKeys(t, path)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{crashEnv + "=1"}
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the crashing child did not exit with a status: %v", err)
	}
	crash := ee.ExitCode()
	if svc["Restart"] != "on-failure" && svc["Restart"] != "always" {
		t.Errorf("Restart=%s: a crash must be restarted", svc["Restart"])
	}
	for _, f := range strings.Fields(svc["RestartPreventExitStatus"]) {
		if f == strconv.Itoa(crash) {
			t.Errorf("RestartPreventExitStatus=%s holds %d, the status of a Go panic: a crashed pinboard is never restarted", svc["RestartPreventExitStatus"], crash)
		}
	}

	unit := unitSection(t, path, "[Unit]")
	burst, err1 := strconv.Atoi(unit["StartLimitBurst"])
	interval, err2 := strconv.Atoi(strings.TrimSuffix(unit["StartLimitIntervalSec"], "s"))
	restart, err3 := strconv.Atoi(strings.TrimSuffix(svc["RestartSec"], "s"))
	if err1 != nil || err2 != nil || err3 != nil || burst < 1 {
		t.Fatalf("want StartLimitBurst and StartLimitIntervalSec in [Unit] and RestartSec in [Service] as whole seconds; got %q, %q, %q",
			unit["StartLimitBurst"], unit["StartLimitIntervalSec"], svc["RestartSec"])
	}
	// burst+1 starts that fail at once span burst × RestartSec.
	if span := time.Duration(burst*restart) * time.Second; span >= time.Duration(interval)*time.Second {
		t.Errorf("StartLimitIntervalSec=%d: %d configuration-error starts take %v, so the limit is never hit and a bad variable restarts for ever", interval, burst+1, span)
	}
	if span := time.Duration(burst) * (storeOpenTimeout + time.Duration(restart)*time.Second); span < time.Duration(interval)*time.Second {
		t.Errorf("StartLimitIntervalSec=%d: %d starts that wait %v for an unreachable Redis take %v, so a Redis outage at boot leaves pinboard failed", interval, burst+1, storeOpenTimeout, span)
	}
}
