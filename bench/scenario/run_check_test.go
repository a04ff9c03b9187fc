package scenario

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A misspelt scenario or a missing program fails before anything starts
// (no output directory, no pinboard, no fleet).
func TestRunChecksBeforeStarting(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"scenario", Config{Scenarios: []string{"hot", "hto"}, PinboardBin: self, NginxBin: self}, `unknown scenario "hto"`},
		{"pinboard", Config{PinboardBin: "/nonexistent/pinboard", NginxBin: self}, `cannot find the pinboard binary "/nonexistent/pinboard"`},
		{"nginx", Config{PinboardBin: self, NginxBin: "/nonexistent/nginx"}, `cannot find nginx "/nonexistent/nginx"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "results")
			tc.cfg.OutDir, tc.cfg.PinbenchBin, tc.cfg.Log = out, self, io.Discard
			_, err := Run(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("unexpected error; got %v; want one with %q", err, tc.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Fatalf("unexpected output directory; got %v; want none created", err)
			}
		})
	}
}
