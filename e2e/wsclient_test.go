package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// wsClientScript drives a WebSocket through pinboard with the Python
// `websockets` client (argv[1]: the URL), printing one line per check.
const wsClientScript = `
import asyncio, os, sys
from websockets.asyncio.client import connect

async def main():
    async with connect(sys.argv[1], max_size=None, ping_interval=None) as ws:
        print("ext", ws.response.headers.get("Sec-WebSocket-Extensions", ""))
        pong = await ws.ping(b"p")
        await asyncio.wait_for(pong, 5)
        print("pong ok")
        await ws.send(["frag-", "ment", "ed"])
        print("fragmented", await asyncio.wait_for(ws.recv(), 10))
        text = "z" * (16 << 20)
        await ws.send(text)
        print("16MiB text", await asyncio.wait_for(ws.recv(), 60) == text)
        blob = os.urandom(8 << 20)
        await ws.send(blob)
        print("8MiB binary", await asyncio.wait_for(ws.recv(), 60) == blob)
        await ws.close(code=4001, reason="client bye")
        print("closed", ws.close_code, ws.close_reason)

asyncio.run(main())
`

// A real WebSocket client (Python websockets) through pinboard to the
// real worker (R-DP-2): permessage-deflate, negotiated between them, is
// carried untouched (Sec-WebSocket-Extensions passed through both ways,
// compressed frames relayed as they are); a ping is answered; a message
// in fragments, a 16 MiB text message and an 8 MiB binary one echo back
// whole; the client's close code and reason come back in the worker's
// Close. Checked by hand too: subprotocols pass through both ways, the
// worker's pings reach the client and its pongs the worker, and a
// worker's Close (code and reason) reaches the client.
func TestWebSocketRealClient_RDP2(t *testing.T) {
	f := sharedFleet(t)
	python, err := pythonPath()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(f.Pinboard.URL, "http") + "/tickers/wsclient/ws"
	out, err := exec.CommandContext(ctx, python, "-c", wsClientScript, url).CombinedOutput()
	if err != nil {
		t.Fatalf("unexpected client failure: %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{
		"ext permessage-deflate",
		"pong ok\n",
		"fragmented frag-mented\n",
		"16MiB text True\n",
		"8MiB binary True\n",
		"closed 4001 client bye\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("unexpected client output; got %q; want it to contain %q", got, want)
		}
	}
}
