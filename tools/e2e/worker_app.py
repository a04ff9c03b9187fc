"""A real `pinned` worker for pinboard-go's end-to-end suite (package e2e).

Run one process per port:

    WORKER_NAME=w1 PINBOARD_URL=http://127.0.0.1:8080 PINBOARD_TOKEN=... \
    ADVERTISE_URL=http://127.0.0.1:8001 \
        python -m uvicorn worker_app:app --host 127.0.0.1 --port 8001

Without PINBOARD_URL the worker runs in local (dev) mode: an in-process
directory, attestation checks off. That is how this file is checked on its own.

Environment:
    PINBOARD_URL, PINBOARD_TOKEN, ADVERTISE_URL  control-plane mode (all three)
    WORKER_NAME         reported by every route, so tests can tell workers apart
    HEARTBEAT_INTERVAL  seconds between heartbeats (default 3.0)
    HEADROOM            constant headroom (int) instead of the memory probe, so
                        tests control placement (R-PL-1, R-PL-3)
    BIND_HOSTNAME, BIND_ENV, BIND_EPOCH, BIND_TAKEOVER
                        hostname-aware binding (R-LS-4): PinnedWorker(hostname=,
                        env=, epoch=, takeover=)
    LEASE_BUFFER        seconds before expires_at at which the lease turns
                        unhealthy (pinned's default is 5.0). Must be well below
                        PINBOARD_LEASE_TTL_MS, or every new activation answers
                        503 "lease unhealthy" with the in-band refusal marker.
    STATE_STORE         "memory": the worker gets pinned's MemoryStateStore, so
                        each host mounts its POST <ns>/<id>/_wake route (the
                        Node pinboard's durable-resurrection sweeper calls it),
                        and a /guarded host is added (below)
    EXTRA_NAMESPACE     one more Counter host at this namespace (the worker's own
                        routes' "/_pinned" is one a worker can register)
    RESPONSE_HEADER_BYTES
                        an app-wide middleware adds a Content-Security-Policy
                        of about this many bytes to every HTTP answer, the
                        challenge probe's too (as a security-headers
                        middleware would)
    COUNTERS_IDLE_TIMEOUT
                        seconds after which an idle /counters or /tickers
                        instance is evicted and its placement released
                        (pinned's default is 300). pinned sweeps every live
                        instance after each request, so a test placing
                        thousands of ids keeps this short to keep requests
                        O(recent ids) instead of O(all ids).

POST /_e2e/drain?deadline=S starts the worker's own drain, POST /_e2e/drain
without a deadline revokes it (not an instance route: no attestation).

Hosts (one PinnedWorker, two PinnedHosts, mounted as the fleet guide says):
    /counters  Counter  GET value, POST increment, POST echo (streams the body
                        back), GET whoami, GET headers, GET caller (the
                        attested calling instance, or an authenticated
                        client's account), GET call?path=P (a
                        cluster call to P), POST sha256 (consumes
                        the body, returns its digest), GET blob?size=N,
                        GET target/{rest} (the raw path and query it got),
                        GET slow?seconds=S (answers after S seconds)
    /tickers   Ticker   GET events?count=N&interval=S (SSE), WS ws (echo)
    /retained  Counter  with release_placement_on_idle=False: instances evict
                        after IDLE_TIMEOUT seconds (default 1) but keep their
                        placement
    /guarded   Guarded  only with STATE_STORE: authorize refuses every request
                        (403), so no instance should ever activate; each
                        activation is recorded, GET /_e2e/activations lists them
"""

import asyncio
import hashlib
import json
import os
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, WebSocket
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from pinned import (
    Attestation,
    AuthRejected,
    PinnedAPI,
    PinnedHost,
    PinnedWorker,
    attestation,
    route,
)
from pinned.durability import MemoryStateStore

WORKER_NAME = os.environ.get("WORKER_NAME", "local")


class FullDuplexStreamingResponse(StreamingResponse):
    """A StreamingResponse that never reads `receive` itself.

    Starlette's StreamingResponse listens for http.disconnect on `receive`
    concurrently with streaming when the server speaks ASGI < 2.4 (uvicorn's
    HTTP protocols say 2.3). That listener would swallow the http.request
    body chunks an echo is still reading through request.stream(). Here the
    body iterator is the only reader; request.stream() raises ClientDisconnect
    when the client goes away.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.stream_response(send)
        except (OSError, ClientDisconnect):
            return


def _headroom() -> Any:
    raw = os.environ.get("HEADROOM")
    if not raw:
        return None
    value = int(raw)
    return lambda: value


def _make_worker() -> PinnedWorker:
    kwargs: dict[str, Any] = {
        "heartbeat_interval": float(os.environ.get("HEARTBEAT_INTERVAL", "3.0")),
    }
    lease_buffer = os.environ.get("LEASE_BUFFER")
    if lease_buffer:
        kwargs["lease_buffer"] = float(lease_buffer)
    headroom = _headroom()
    if headroom is not None:
        kwargs["headroom"] = headroom
    # Hostname-aware binding (R-LS-4): PinnedWorker(hostname=, env=, epoch=,
    # takeover=).
    if os.environ.get("BIND_HOSTNAME"):
        kwargs["hostname"] = os.environ["BIND_HOSTNAME"]
        kwargs["env"] = os.environ.get("BIND_ENV") or None
        kwargs["epoch"] = int(os.environ.get("BIND_EPOCH", "0"))
        if os.environ.get("BIND_TAKEOVER"):
            kwargs["takeover"] = os.environ["BIND_TAKEOVER"]
    # Passed explicitly: pinned 0.16.0's PinnedWorker reads no environment
    # (without pinboard_url it runs in local mode), and a half-set
    # environment fails loudly here.
    if os.environ.get("STATE_STORE") == "memory":
        kwargs["state_store"] = MemoryStateStore()
    pinboard_url = os.environ.get("PINBOARD_URL")
    if pinboard_url:
        kwargs["pinboard_url"] = pinboard_url
        kwargs["token"] = os.environ.get("PINBOARD_TOKEN")
        kwargs["advertise_url"] = os.environ.get("ADVERTISE_URL")
    return PinnedWorker(**kwargs)


class Counter(PinnedAPI):
    count = 0

    @route.get("/value")
    async def value(self) -> dict[str, Any]:
        return {"id": self.id, "count": self.count, "worker": WORKER_NAME}

    @route.post("/increment")
    async def increment(self) -> dict[str, Any]:
        self.count += 1
        return {"id": self.id, "count": self.count, "worker": WORKER_NAME}

    @route.get("/slow")
    async def slow(self, seconds: float = 1.0) -> dict[str, Any]:
        # An in-flight request that outlives a pinboard SIGTERM (graceful
        # shutdown tests).
        await asyncio.sleep(seconds)
        return {"id": self.id, "worker": WORKER_NAME, "slept": seconds}

    @route.get("/whoami")
    async def whoami(self) -> dict[str, Any]:
        return {"worker": WORKER_NAME, "id": self.id}

    @route.get("/late-body")
    async def late_body(self, status: int = 204) -> Response:
        # A 204 or 304 whose Content-Length announces a body the app sends
        # a moment later, as a whole answer: uvicorn on httptools writes it
        # after the header (e2e TestUvicornStandardStack, "late body").
        late = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\ncontent-type: text/plain\r\n\r\nINJECTED"

        async def body() -> AsyncIterator[bytes]:
            await asyncio.sleep(0.3)
            yield late

        return StreamingResponse(body(), status_code=status, headers={"content-length": str(len(late))})

    @route.get("/caller")
    async def caller(self, request: Request) -> dict[str, Any]:
        # The attested calling instance, if this request is a cluster call
        # (R-TR-6): pinned verified pinboard's attestation and its caller claim.
        # An authenticated client's request carries the account instead
        # (R-TR-4, R-TR-5): the passport key's sub, scopes and claims.
        who = attestation(request)
        if isinstance(who, Attestation.Instance):
            return {"worker": WORKER_NAME, "id": self.id, "caller": f"{who.ns}/{who.id}", "depth": who.depth}
        if isinstance(who, Attestation.Account):
            account = {"sub": who.sub, "scopes": sorted(who.scopes), "claims": dict(who.claims)}
            return {"worker": WORKER_NAME, "id": self.id, "caller": None, "depth": None, "account": account}
        return {"worker": WORKER_NAME, "id": self.id, "caller": None, "depth": None}

    @route.get("/call")
    async def call(self, path: str) -> dict[str, Any]:
        # An instance-to-instance call through pinned's cluster client: in
        # process when the target id lives here, else through pinboard with
        # this instance attested as the caller (R-TR-6, R-PL-4).
        res = await self.cluster.get(path)
        try:
            body: Any = res.json()
        except ValueError:
            body = res.text
        return {"worker": WORKER_NAME, "id": self.id, "status": res.status_code, "body": body}

    @route.get("/headers")
    async def headers(self, request: Request) -> dict[str, Any]:
        # Lists, not a dict: repeated headers must stay visible.
        return {
            "worker": WORKER_NAME,
            "id": self.id,
            "headers": [[k, v] for k, v in request.headers.items()],
        }

    @route.get("/target/{rest:path}")
    async def target(self, request: Request, rest: str) -> dict[str, Any]:
        # The request target as uvicorn got it, undecoded: pinboard must
        # forward path and query byte for byte (R-DP-1).
        return {
            "worker": WORKER_NAME,
            "id": self.id,
            "rawPath": request.scope.get("raw_path", b"").decode("latin-1"),
            "query": request.scope["query_string"].decode("latin-1"),
        }

    @route.post("/echo")
    async def echo(self, request: Request) -> Response:
        # Full duplex: each chunk goes back as soon as it arrives; the body is
        # never held whole (R-DP-2).
        async def body() -> AsyncIterator[bytes]:
            async for chunk in request.stream():
                if chunk:
                    yield chunk

        return FullDuplexStreamingResponse(
            body(), media_type="application/octet-stream"
        )

    @route.post("/sha256")
    async def sha256(self, request: Request) -> dict[str, Any]:
        digest = hashlib.sha256()
        size = 0
        async for chunk in request.stream():
            digest.update(chunk)
            size += len(chunk)
        return {"worker": WORKER_NAME, "size": size, "sha256": digest.hexdigest()}

    @route.get("/blob")
    async def blob(self, size: int = 0) -> Response:
        # Deterministic bytes: byte i is i % 251, so a client can verify
        # without the worker sending a digest.
        block = bytes(i % 251 for i in range(251 * 256))

        async def body() -> AsyncIterator[bytes]:
            left = size
            while left > 0:
                n = min(left, len(block))
                yield block[:n]
                left -= n

        return StreamingResponse(
            body(),
            media_type="application/octet-stream",
            headers={"x-blob-size": str(size)},
        )


class Ticker(PinnedAPI):
    @route.get("/events")
    async def events(self, count: int = 5, interval: float = 0.5) -> Response:
        async def stream() -> AsyncIterator[str]:
            for n in range(count):
                if n:
                    await asyncio.sleep(interval)
                # t is taken at emission, so the client can measure how long
                # the proxy held the event (R-DP-2).
                event = {"n": n, "t": time.time(), "worker": WORKER_NAME}
                yield f"data: {json.dumps(event)}\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    @route.websocket("/ws")
    async def ws(self, websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is not None:
                    await websocket.send_text(message["text"])
                elif message.get("bytes") is not None:
                    await websocket.send_bytes(message["bytes"])
        except WebSocketDisconnect:
            return


# Ids of Guarded instances that activated (ran their lifespan).
ACTIVATIONS: list[str] = []


class Guarded(PinnedAPI):
    async def authorize(self, conn: Any) -> Any:
        # pinned runs this before lifespan on a cold instance: a denied
        # request never activates (PinnedAPI.authorize).
        raise AuthRejected("denied", status_code=403)

    async def lifespan(self) -> AsyncIterator[None]:
        ACTIVATIONS.append(self.id)
        yield

    @route.get("/value")
    async def value(self) -> dict[str, Any]:
        return {"id": self.id, "worker": WORKER_NAME}


def _host_kwargs() -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    raw = os.environ.get("COUNTERS_IDLE_TIMEOUT")
    if raw:
        kwargs["idle_timeout"] = float(raw)
    # MAX_INSTANCES: the host's instance cap; past it new activations are
    # answered 503 "instance capacity reached; retry".
    raw = os.environ.get("MAX_INSTANCES")
    if raw:
        kwargs["max_instances"] = int(raw)
    return kwargs


worker = _make_worker()
counters = PinnedHost(Counter, worker=worker, namespace="/counters", **_host_kwargs())
tickers = PinnedHost(Ticker, worker=worker, namespace="/tickers", **_host_kwargs())
# Retained idle placements: instances evict after IDLE_TIMEOUT seconds but
# keep their placement until released or the session ends (guide: "Host(Api,
# release_placement_on_idle=False)").
retained = PinnedHost(
    Counter,
    worker=worker,
    namespace="/retained",
    release_placement_on_idle=False,
    idle_timeout=float(os.environ.get("IDLE_TIMEOUT", "1.0")),
    sweep_interval=0.25,
)

guarded = (
    PinnedHost(Guarded, worker=worker, namespace="/guarded")
    if worker.state_store is not None
    else None
)

extra = (
    PinnedHost(Counter, worker=worker, namespace=os.environ["EXTRA_NAMESPACE"])
    if os.environ.get("EXTRA_NAMESPACE")
    else None
)

app = FastAPI()
app.include_router(worker)
app.include_router(counters)
app.include_router(tickers)
app.include_router(retained)
if guarded is not None:
    app.include_router(guarded)
if extra is not None:
    app.include_router(extra)



class _LargeHeader:
    """Pure ASGI middleware adding one long header to every HTTP answer
    (RESPONSE_HEADER_BYTES): the challenge route answers through it too."""

    def __init__(self, app: Any, size: int) -> None:
        self.app = app
        directive = b"default-src 'self' https://cdn.example; "
        self.value = (directive * max(1, size // len(directive))).rstrip(b"; ")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_header(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"content-security-policy", self.value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_header)


if os.environ.get("RESPONSE_HEADER_BYTES"):
    app.add_middleware(_LargeHeader, size=int(os.environ["RESPONSE_HEADER_BYTES"]))

_drains: set["asyncio.Task[None]"] = set()


@app.post("/_e2e/drain")
async def self_drain(deadline: float | None = None) -> dict[str, Any]:
    """The worker's own drain (PinnedWorker.drain, as install_sigterm_drain
    would start it): with `deadline` (seconds) it stops taking new ids and
    heartbeats draining: true; without, it revokes the drain."""
    if deadline is None:
        await worker.drain(None)
    else:
        task = asyncio.get_running_loop().create_task(worker.drain(deadline))
        _drains.add(task)
        task.add_done_callback(_drains.discard)
    return {"worker": WORKER_NAME, "draining": worker.draining}


@app.get("/_e2e/activations")
async def activations() -> dict[str, Any]:
    """Ids of /guarded instances that activated (STATE_STORE only)."""
    return {"worker": WORKER_NAME, "ids": ACTIVATIONS}


@app.get("/healthz")
async def healthz() -> dict[str, Any]:
    """Process liveness and pinned readiness (registered and inside the lease)."""
    return {"worker": WORKER_NAME, "ready": worker.ready, "superseded": worker.superseded}
