package directory_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Opening the Redis directory as cmd/pinboard does: a malformed URL is a
// configuration error, anything else an outage to retry.
func ExampleOpenRedis() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := directory.OpenRedis(ctx, "redis+cluster://10.0.0.1:7000,10.0.0.2:7000", directory.RedisOptions{
		LeaseTTL: 15 * time.Second,
	})
	switch {
	case errors.Is(err, directory.ErrInvalidURL):
		log.Fatalf("REDIS_URL: %v", err)
	case err != nil:
		log.Fatalf("cannot reach the directory: %v", err)
	}
	defer store.Close()
	// Hand store to server.Options.Store; every node on the same URL
	// shares the directory.
}
