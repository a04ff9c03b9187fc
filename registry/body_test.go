package registry

import (
	"errors"
	"testing"
)

// decode's schema check (R-REG-7): keys are matched exactly, as the
// reference reads them; unknown keys are ignored; arrays of objects are
// checked element by element.
func TestDecodeExactKeys_RREG7(t *testing.T) {
	type item struct {
		SessionID *string `json:"sessionId"`
		ID        *string `json:"id"`
	}
	cases := []struct {
		name string
		body string
		into any
		want error
	}{
		{"exact", `{"sessionId":"s","id":"x"}`, &item{}, nil},
		{"unknown key ignored", `{"sessionId":"s","id":"x","extra":{"SessionId":1}}`, &item{}, nil},
		{"other case", `{"sessionid":"s"}`, &item{}, errShape},
		{"other case later", `{"id":"x","SessionID":"s"}`, &item{}, errShape},
		{"array exact", `[{"sessionId":"s"},{"id":"x"}]`, &[]item{}, nil},
		{"array other case", `[{"sessionId":"s"},{"ID":"x"}]`, &[]item{}, errShape},
		{"array with null", `[null,{"Id":"x"}]`, &[]item{}, errShape},
		{"invalid", `{"sessionId":`, &item{}, errInvalidJSON},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := decode([]byte(tc.body), tc.into); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("unexpected result; got %v; want %v", err, tc.want)
			}
		})
	}
}
