package proxy

import "net"

// relay tracks and runs a WebSocket relay between client and upstream as
// serveWebSocket does once its hijack ran, for tests that drive a relay
// without a server around it.
func (hj *hijacks) relay(client, upstream net.Conn, handshake, pending, early []byte) {
	hj.run(hj.start(client, upstream, nil), handshake, pending, early)
}
