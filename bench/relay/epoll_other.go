//go:build !linux

package relay

import (
	"context"
	"errors"
)

func serveEpoll(context.Context, Options) error {
	return errors.New("relay: the epoll shape needs Linux")
}
