package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// parseFlags parses args into fs. A parse error prints one line and a
// pointer to -h instead of the whole flag list; -h prints the flags and
// exits 0. ok false means: return code.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		return 0, false
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v (see %s -h)\n", fs.Name(), err, fs.Name())
		return 2, false
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument %q (flags only; see %s -h)\n", fs.Name(), fs.Arg(0), fs.Name())
		return 2, false
	}
	return 0, true
}
