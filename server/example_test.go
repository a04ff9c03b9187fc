package server_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
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

// A complete embedding, run: the passport from JSON with its token
// supplied by the program, the memory store, a base path, the lease TTL
// and an affinity key; served on a port the kernel picks, stopped
// gracefully by canceling the context, and the store closed last, once
// Serve returned (R-SRV-4).
func ExamplePinboard_Serve() {
	passport, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"pinboard","keys":[{
		"name":"deployment","token":{"env":"PINBOARD_TOKEN"},
		"scopes":["pinboard:worker","pinboard:operator"],
		"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}}]}],
		"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(name string) (string, bool) { return "example-token", name == "PINBOARD_TOKEN" })
	if err != nil {
		log.Fatal(err)
	}
	const ttl = 5 * time.Second
	store := directory.NewMemory(ttl, time.Now()) // the store grants the leases
	pb, err := server.New(server.Options{
		Store:    store,
		Passport: passport,
		BasePath: "/pb",
		LeaseTTL: ttl, // or 0: the store's
		AffinityKey: func(ctx *fasthttp.RequestCtx) (string, bool) {
			k := ctx.Request.Header.Peek("X-Thread-Id")
			return string(k), len(k) > 0
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- pb.Serve(ctx, ln, 5*time.Second) }()

	// Outside the base path nothing is served. The first placement
	// attempt after a boot starts one lease of 503 (R-CS-1): workers
	// re-register their live ids before new ones are placed.
	base := "http://" + ln.Addr().String()
	for _, path := range []string{"/pb/livez", "/livez", "/pb/counters/alice/value"} {
		resp, err := http.Get(base + path)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s %d %s\n", path, resp.StatusCode, strings.TrimSpace(string(body)))
	}

	cancel() // graceful shutdown; Serve returns once it is done
	if err := <-served; err != nil {
		log.Fatal(err)
	}
	if err := store.Close(); err != nil { // the caller's: closed after Serve
		log.Fatal(err)
	}
	// Output:
	// /pb/livez 200 {"ok":true}
	// /livez 404 {"error":"not found"}
	// /pb/counters/alice/value 503 {"error":"cold start: placements resume in 5000ms"}
}
