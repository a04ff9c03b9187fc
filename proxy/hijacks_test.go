package proxy

import (
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// relay tracks and runs a WebSocket relay between client and upstream as
// serveWebSocket does once its hijack ran, for tests that drive a relay
// without a server around it.
func (hj *hijacks) relay(client, upstream net.Conn, handshake, pending, early []byte) {
	hj.run(hj.start(client, upstream, nil, nil), handshake, pending, early)
}

// A hijack that shutdown abandoned before its orphan timer was stored
// (cutRelays racing the handler) stops that timer: abandon found none to
// stop, and the timer held the guard and the body it refers to for
// hijackWait (R-DP-2).
func TestAbandonedBeforeHijackStopsTimer_RDP2(t *testing.T) {
	orphaned := 0
	g := &hijackGuard{orphaned: func() { orphaned++ }}
	g.abandon()
	var ctx fasthttp.RequestCtx
	g.hijack(&ctx, func(net.Conn) { t.Error("unexpected run of an abandoned hijack") })
	if g.timer.Load().Stop() {
		t.Fatal("unexpected orphan timer still running after the hijack was abandoned; want it stopped")
	}
	if orphaned != 1 {
		t.Fatalf("unexpected orphaned calls; got %d; want 1", orphaned)
	}
}
