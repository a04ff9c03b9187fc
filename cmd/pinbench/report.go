package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/pinboard-go/pinboard/bench/scenario"
)

// runReport is `pinbench report`: BENCHMARKS.md and the plots again from
// a saved results.json, without measuring (after editing the text or
// merging another engineer's block).
func runReport(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pinbench report", flag.ContinueOnError)
	results := fs.String("results", "", "results.json of a run (required)")
	markdown := fs.String("markdown", "BENCHMARKS.md", "BENCHMARKS.md to rewrite")
	plots := fs.String("plots", "docs/bench", "directory for the plots BENCHMARKS.md links")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *results == "" {
		fmt.Fprintln(stderr, "pinbench report: -results is required")
		return 2
	}
	b, err := os.ReadFile(*results)
	if err != nil {
		fmt.Fprintf(stderr, "pinbench report: %v\n", err)
		return 1
	}
	var res scenario.Results
	if err := json.Unmarshal(b, &res); err != nil {
		fmt.Fprintf(stderr, "pinbench report: cannot parse %s: %v\n", *results, err)
		return 1
	}
	files, err := drawPlots(&res, filepath.Dir(*results))
	if err == nil && *plots != "" {
		err = os.MkdirAll(*plots, 0o755)
		for _, f := range files {
			if err != nil {
				break
			}
			var data []byte
			if data, err = os.ReadFile(f); err == nil {
				err = os.WriteFile(filepath.Join(*plots, filepath.Base(f)), data, 0o644)
			}
		}
	}
	if err == nil {
		err = scenario.WriteMarkdown(*markdown, &res, *plots, files)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pinbench report: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "pinbench: %s rewritten from %s\n", *markdown, *results)
	return 0
}
