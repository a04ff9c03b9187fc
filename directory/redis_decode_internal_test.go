package directory

import (
	"strings"
	"testing"
	"time"
)

// FuzzControlMessageRoundTrip_RCM1 checks the stored form of a control message
// (R-CM-1): what encodeMessage writes for a message id without a space,
// a namespace without a NUL and any deadline decodes to the same message,
// the deadline rounded up to the microsecond it is stored in; and
// decodeMessage takes any stored string without panicking.
func FuzzControlMessageRoundTrip_RCM1(f *testing.F) {
	f.Add("0123456789abcdef", "/counters", "alice", int64(1700000000123456789), true)
	f.Add("0123456789abcdef", "/c", "a.b", int64(0), false)
	f.Add("", "/ü", "-", int64(-1), true)
	f.Add("0123456789abcdef", "/c d", "x", int64(999), true)
	f.Fuzz(func(t *testing.T, msgID, ns, id string, deadline int64, has bool) {
		_, _ = decodeMessage(msgID + ns + id)
		if strings.IndexByte(msgID, ' ') >= 0 || strings.IndexByte(ns, 0) >= 0 {
			return
		}
		in := ControlMessage{MsgID: msgID, Type: "wind_down", NS: ns, ID: id}
		var d time.Time
		if has {
			d = time.Unix(0, deadline)
			in.Deadline = &d
		}
		out, ok := decodeMessage(encodeMessage(in))
		if !ok || out.MsgID != in.MsgID || out.Type != in.Type || out.NS != in.NS || out.ID != in.ID || (out.Deadline != nil) != has {
			t.Fatalf("unexpected round trip of %+v; got %+v, %v", in, out, ok)
		}
		if has {
			if got := out.Deadline.Sub(d); got < 0 || got >= time.Microsecond {
				t.Fatalf("unexpected deadline for %v; got %v (%v off)", d, *out.Deadline, got)
			}
		}
	})
}

// FuzzDecodeInfo_RREG1_RREG4 feeds decodeInfo rows of any shape (fields separated by
// "|"): it must not panic, refuses short rows and rows without a client
// id, and splits namespaces on the single space Register joined them with.
func FuzzDecodeInfo_RREG1_RREG4(f *testing.F) {
	f.Add("s|c|p:k|sec|http://127.0.0.1:9/a|/a /b|app.example|blue|3|1700000000000000|1700000015000000|7.5|0|1|2|1|1700000030000000|{\"blue\":\"x\"}")
	f.Add("s|c|||u|/a||||||NaN|1|0|x|0||{")
	f.Add("s||||||||||||||||||")
	f.Fuzz(func(t *testing.T, row string) {
		fields := strings.Split(row, "|")
		info, ok := decodeInfo(fields)
		if !ok {
			if len(fields) >= infoFields && fields[1] != "" {
				t.Fatalf("unexpected refusal of %q", row)
			}
			return
		}
		if len(fields) < infoFields || info.ClientID == "" {
			t.Fatalf("unexpected acceptance of %q", row)
		}
		if got := strings.Join(info.Namespaces, " "); got != fields[5] {
			t.Fatalf("unexpected namespaces of %q; got %q", fields[5], info.Namespaces)
		}
	})
}
