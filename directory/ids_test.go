package directory_test

import (
	"strings"
	"testing"

	"github.com/pinboard-go/pinboard/directory"
)

// CheckID is the reference worker's id rule (R-DP-1), shared by the data
// plane's path parse and the registry's bodies.
func TestCheckID_RDP1(t *testing.T) {
	for id, want := range map[string]error{
		"alice": nil, "A-z_0.9~": nil, strings.Repeat("a", 256): nil, "...": nil,
		"": directory.ErrEmptyID, strings.Repeat("a", 257): directory.ErrLongID,
		"al ice": directory.ErrIDCharset, "a\x00b": directory.ErrIDCharset, "al%20ice": directory.ErrIDCharset, "é": directory.ErrIDCharset,
		".": directory.ErrDotID, "..": directory.ErrDotID,
	} {
		if got := directory.CheckID(id); got != want {
			t.Errorf("unexpected CheckID(%q); got %v; want %v", id, got, want)
		}
		if got := directory.CheckID([]byte(id)); got != want {
			t.Errorf("unexpected CheckID([]byte(%q)); got %v; want %v", id, got, want)
		}
	}
}
