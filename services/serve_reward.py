"""`rlhf serve-reward MODEL_URI`: a registered reward model behind the HTTP reward protocol, so that PPO runs (on this
machine or others) can add it as a reward source of kind http next to their own RM.

Protocol (`rlhf_lib.rewards.http` is its client):
- `POST /score`, header `Authorization: Bearer <token>`, body `TextBatch.to_json()`:
  `{"prompts": [...], "completions": [...], "finished": [...], "columns": {...}}` -> 200 `{"scores": [...]}`.
  401: no or wrong token. 413: a body over `--max-body-mb` (its Content-Length, or the bytes as they arrive) or more
  rows than `--max-batch` (counted before the rows are parsed). 400: the body is not JSON or nests too deep. 408: the
  body took longer than `BODY_TIMEOUT_S`. 422: a field is missing or mistyped, or a row cannot be scored (the message
  names it). Errors are `{"detail": "..."}`.
- `GET /health` (no token) -> `{"status": "ok", "model": MODEL_URI, ...}`.

Bounds, so that one client cannot exhaust the server: the body cap above; each text cut to `CHARS_PER_TOKEN` x
max_length characters before it is tokenized (`TextRewardModel`); a connection that has not sent its request's
headers within `HEADER_TIMEOUT_S` is closed (`TimedH11Protocol`), one whose body is not in within `BODY_TIMEOUT_S`
gets 408; one forward at a time. `--tls-cert`/`--tls-key` serve https.

The token is required: the server refuses to start without its environment variable. It binds to loopback unless
`--host` says otherwise.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

# At module level: FastAPI reads the routes' annotations (`Request`) from this module's globals. `cli.main` imports
# this module only for `serve-reward`.
from fastapi import FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from rlhf_lib.rewards.base import RewardError, TextBatch

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_TOKEN_ENV = "RLHF_REWARD_TOKEN"
DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_BODY_MB = 16.0  # 256 rows of ~64k characters each
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0

Scorer = Callable[[TextBatch], Sequence[float]]


class ServeError(RuntimeError):
    """The server cannot start: the message names the variable or option to fix."""


def bearer_ok(header: str | None, token: str) -> bool:
    """Whether an `Authorization` header carries `token`, compared in constant time."""
    scheme, _, value = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


async def read_body(request: Request, cap: int, timeout_s: float) -> bytes:
    """The request's body, refused with 413 as soon as it is over `cap` bytes (its Content-Length first, then the
    bytes as they arrive: a chunked body has none) and with 408 when it is not in within `timeout_s`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise HTTPException(400, f"Content-Length is not a number: {declared[:40]!r}")
        if int(declared) > cap:
            raise HTTPException(413, f"a body of {int(declared):,} bytes; this server takes at most {cap:,} "
                                "(--max-body-mb): send fewer rows per request")
    body = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > cap:
                raise HTTPException(413, f"a body of over {cap:,} bytes; this server takes at most {cap:,} "
                                    "(--max-body-mb): send fewer rows per request")

    try:
        await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise HTTPException(408, f"the body did not arrive within {timeout_s:g} s") from None
    return bytes(body)


def make_app(scorer: Scorer, token: str, max_batch: int, model_name: str, info: dict[str, Any] | None = None,
             max_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20), body_timeout_s: float = BODY_TIMEOUT_S
             ) -> FastAPI:
    """The app of the protocol above around `scorer`. `info` adds keys to the health answer (e.g. the digest)."""
    if not token:
        raise ServeError("serve-reward: an empty token would let anyone score")
    # No /docs or /openapi.json: an unauthenticated page the protocol does not need.
    app = FastAPI(title="rlhf reward", docs_url=None, redoc_url=None, openapi_url=None)
    # One forward at a time: concurrent requests would each hold a batch of activations on the device.
    lock = threading.Lock()

    def score_locked(batch: TextBatch) -> list[float]:
        with lock:
            return list(scorer(batch))

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, **(info or {})}

    @app.post("/score")
    async def score(request: Request) -> dict[str, list[float]]:
        if not bearer_ok(request.headers.get("authorization"), token):
            raise HTTPException(401, "missing or wrong bearer token (send Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        raw = await read_body(request, max_body_bytes, body_timeout_s)
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise HTTPException(400, f"the request body is not JSON: {e}") from None
        except RecursionError:
            raise HTTPException(400, "the request body nests too deep to be a batch") from None
        rows = body.get("completions") if isinstance(body, dict) else None
        if isinstance(rows, list) and len(rows) > max_batch:  # before any row is parsed
            raise HTTPException(413, f"{len(rows)} rows in one request; this server takes at most {max_batch} "
                                "(--max-batch): send fewer rows per request (batch_size of the http reward source)")
        try:
            batch = TextBatch.from_json(body)
        except (ValueError, RecursionError) as e:
            raise HTTPException(422, str(e) if isinstance(e, ValueError) else "a field nests too deep") from None
        try:
            return {"scores": await run_in_threadpool(score_locked, batch)}
        except RewardError as e:  # a row that cannot be scored (the message names it)
            raise HTTPException(422, str(e)) from None

    return app


def timed_protocol(header_timeout_s: float = HEADER_TIMEOUT_S):
    """uvicorn's h11 protocol class, closing a connection whose request headers are not complete `header_timeout_s`
    after it opened or after its last answer (uvicorn bounds only idle keep-alive connections; a client sending
    half a request line would hold its connection forever). Passed as `uvicorn.run(http=...)`; it reads the
    protocol's `conn`, `loop` and `transport` attributes (uvicorn 0.54; pinned by tests/flows/test_serve_reward.py)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        def _arm(self) -> None:
            self.loop.call_later(header_timeout_s, self._headers_due)

        def _headers_due(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

    return TimedH11Protocol


def read_token(token_env: str) -> str:
    """The bearer token from `$token_env`, or a `ServeError` naming the variable (never a value)."""
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise ServeError(f"serve-reward: environment variable {token_env} is not set; it must hold the bearer token "
                         f"clients send (e.g. export {token_env}=$(python -c 'import secrets; "
                         "print(secrets.token_urlsafe(32))'), and set token_env of the http reward source to the "
                         "variable that holds the same value)")
    return token


def load_scorer(model_uri: str, device: str = "auto", max_length: int | None = None, batch_size: int = 32):
    """The registered RM of `model_uri` on `device` as a `TextRewardModel`, and its identity for the health answer.

    Resolved and downloaded as the pipeline does for `--reward-model` (`stages.cache.given_model`: a version or alias
    is named before anything is downloaded; the files are checked against their digest)."""
    from rlhf_lib.devices import DeviceUnavailable, resolve_device
    from rlhf_lib.model_dirs import load_scalar
    from rlhf_lib.models import load_tokenizer
    from rlhf_lib.rewards.text_rm import TextRewardModel
    from stages.artifact_cache import download
    from stages.cache import given_model
    from stages.tracking import setup_mlflow

    try:
        where = resolve_device(device)
    except DeviceUnavailable as e:  # its message names the config key; here the option is the place
        raise ServeError(f"serve-reward: {e}".replace("resources.device=", "--device ")) from None
    setup_mlflow()
    result = given_model("reward", model_uri)
    path = download(result.artifact_uri, result.digest)
    model = load_scalar(path).to(where)
    scorer = TextRewardModel(model, load_tokenizer(path), max_length, batch_size, name=f"reward model {model_uri}")
    info = {"source": result.model_uri or result.artifact_uri, "digest": result.digest, "device": str(where),
            "max_length": scorer.max_length}
    return scorer, info


def serve(model_uri: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, token_env: str = DEFAULT_TOKEN_ENV,
          max_batch: int = DEFAULT_MAX_BATCH, max_length: int | None = None, batch_size: int = 32,
          device: str = "auto", max_body_mb: float = DEFAULT_MAX_BODY_MB, tls_cert: str | None = None,
          tls_key: str | None = None) -> int:
    """Resolve, load and serve `model_uri` until interrupted. The token is checked first: a refusal costs nothing."""
    import uvicorn

    token = read_token(token_env)
    if max_batch < 1 or batch_size < 1 or (max_length is not None and max_length < 2) or not max_body_mb > 0:
        raise ServeError(f"serve-reward: --max-batch and --batch-size must be >= 1, --max-length >= 2 and "
                         f"--max-body-mb > 0, got {max_batch}, {batch_size}, {max_length}, {max_body_mb}")
    if (tls_cert is None) != (tls_key is None):
        raise ServeError("serve-reward: --tls-cert and --tls-key go together (a certificate and its private key)")
    for option, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not os.path.isfile(path):
            raise ServeError(f"serve-reward: {option} {path}: no such file")
    scorer, info = load_scorer(model_uri, device, max_length, batch_size)
    app = make_app(scorer, token, max_batch, model_uri, info, max_body_bytes=int(max_body_mb * 2**20))
    where = "loopback only" if host in ("127.0.0.1", "::1", "localhost") else "reachable from other machines"
    scheme = "https" if tls_cert else "http"
    print(f"serving {model_uri} ({info['source']}, {info['device']}) on {scheme}://{host}:{port}/score ({where}); "
          f"token from ${token_env}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="info", http=timed_protocol(), timeout_keep_alive=5,
                ssl_certfile=tls_cert, ssl_keyfile=tls_key)
    return 0
