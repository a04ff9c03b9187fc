package server_test

import (
	"context"
	"log"
	"net"
	"os"
	"os/signal"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/server"
)

// Embedding pinboard in a Go program: the counterpart of the Node
// package's servePinboard({ redis, passport, affinity: { key } })
// (R-SRV-4).
func ExampleNew() {
	passport, err := attest.ParsePassport([]byte(os.Getenv("PINBOARD_PASSPORT")), os.LookupEnv)
	if err != nil {
		log.Fatal(err)
	}
	pb, err := server.New(server.Options{
		Store:    directory.NewMemory(server.DefaultLeaseTTL, time.Now()),
		Passport: passport,
		BasePath: "/pinboard",
		LeaseTTL: server.DefaultLeaseTTL,
		// A stable per-thread key spreads independent threads; ok=false
		// (null) places new ids by power of two choices.
		AffinityKey: func(ctx *fasthttp.RequestCtx) (string, bool) {
			k := ctx.Request.Header.Peek("X-Thread-Id")
			return string(k), len(k) > 0
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:8080")
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := pb.Serve(ctx, ln, 25*time.Second); err != nil {
		log.Fatal(err)
	}
}
