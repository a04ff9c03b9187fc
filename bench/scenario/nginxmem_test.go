package scenario

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

// nginx's memory counts the pages its master and workers share once:
// summed, their RSS read about 11 MiB over the 20 MiB they hold
// (bench.ProcTree sums their proportional set sizes instead). Skipped
// without nginx (make bench installs it).
func TestNginxMemoryCountsSharedPagesOnce(t *testing.T) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin = "/usr/sbin/nginx"
		if _, err := os.Stat(bin); err != nil {
			t.Skip("no nginx")
		}
	}
	ps := &procs{dir: t.TempDir()}
	defer ps.stopAll()
	up := httptest.NewServer(http.NotFoundHandler())
	defer up.Close()
	port, _ := strconv.Atoi(up.URL[strings.LastIndexByte(up.URL, ':')+1:])
	n, err := ps.startNginx(bin, 2, []int{port})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	st, err := bench.ProcTree(n.pid())
	if err != nil {
		t.Fatal(err)
	}
	var pss int64
	for _, p := range append([]int{n.pid()}, bench.Children(n.pid())...) {
		f, err := os.Open("/proc/" + strconv.Itoa(p) + "/smaps_rollup")
		if err != nil {
			t.Skip("no smaps_rollup")
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				pss += kb << 10
			}
		}
		f.Close()
	}
	if float64(st.RSS) > 1.1*float64(pss) {
		t.Fatalf("unexpected nginx memory; got %.1f MiB; want about %.1f MiB (PSS summed over master and workers)",
			float64(st.RSS)/(1<<20), float64(pss)/(1<<20))
	}
}
