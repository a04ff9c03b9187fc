// Package e2e proves the pinboard binary (cmd/pinboard) against real Python
// workers: the reference worker package pinned==0.16.0 running
// tools/e2e/worker_app.py under uvicorn. Workers run uvicorn's h11 parser on
// asyncio's loop (plain `pip install uvicorn`) unless a test picks another
// stack (WorkerOptions.Stack): TestUvicornStandardStack_* runs them on
// httptools and uvloop, what uvicorn[standard] runs by default.
//
// The package has no API; everything lives in _test.go files. Each test names
// the REQUIREMENTS.md ids it proves (docs: /work/shared/spec/REQUIREMENTS.md).
//
// Running:
//
//	make test                                   # creates .venv with pinned==0.16.0
//	go test ./e2e/ -count=1 -v                  # uses <repo>/.venv/bin/python
//	PINBOARD_E2E_PYTHON=/path/to/python go test ./e2e/ -count=1
//
// The suite builds ./cmd/pinboard once per run into a temporary directory,
// starts pinboard on a free 127.0.0.1 port with REDIS_URL=memory: and a short
// PINBOARD_LEASE_TTL_MS, starts workers on free ports, and kills every process
// it started when the test (or the run) ends. All traffic stays on 127.0.0.1.
// `go test -short` skips the suite.
package e2e
