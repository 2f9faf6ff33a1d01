"""`rlhf serve-reward MODEL_URI`: a registered reward model behind the HTTP reward protocol, so that PPO runs (on this
machine or others) can add it as a reward source of kind http next to their own RM.

Protocol (`rlhf_lib.rewards.http` is its client):
- `POST /score`, header `Authorization: Bearer <token>`, body `TextBatch.to_json()`:
  `{"prompts": [...], "completions": [...], "finished": [...], "columns": {...}}` -> 200 `{"scores": [...]}`.
  401: no or wrong token. 413: more rows than `--max-batch`. 400: the body is not JSON. 422: a field is missing or
  mistyped, or a row cannot be scored (the message names it). Errors are `{"detail": "..."}`.
- `GET /health` (no token) -> `{"status": "ok", "model": MODEL_URI, ...}`.

The token is required: the server refuses to start without its environment variable. It binds to loopback unless
`--host` says otherwise.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

# At module level: FastAPI reads the routes' annotations (`Request`) from this module's globals. `flows.cli` imports
# this module only for `serve-reward`.
from fastapi import FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from rlhf_lib.rewards.base import RewardError, TextBatch

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_TOKEN_ENV = "RLHF_REWARD_TOKEN"
DEFAULT_MAX_BATCH = 256

Scorer = Callable[[TextBatch], Sequence[float]]


class ServeError(RuntimeError):
    """The server cannot start: the message names the variable or option to fix."""


def bearer_ok(header: str | None, token: str) -> bool:
    """Whether an `Authorization` header carries `token`, compared in constant time."""
    scheme, _, value = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def make_app(scorer: Scorer, token: str, max_batch: int, model_name: str, info: dict[str, Any] | None = None
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
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            raise HTTPException(400, f"the request body is not JSON: {e}") from None
        try:
            batch = TextBatch.from_json(body)
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        if len(batch) > max_batch:
            raise HTTPException(413, f"{len(batch)} rows in one request; this server takes at most {max_batch} "
                                "(--max-batch): send fewer rows per request (batch_size of the http reward source)")
        try:
            return {"scores": await run_in_threadpool(score_locked, batch)}
        except RewardError as e:  # a row that cannot be scored (the message names it)
            raise HTTPException(422, str(e)) from None

    return app


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
          device: str = "auto") -> int:
    """Resolve, load and serve `model_uri` until interrupted. The token is checked first: a refusal costs nothing."""
    import uvicorn

    token = read_token(token_env)
    if max_batch < 1 or batch_size < 1 or (max_length is not None and max_length < 2):
        raise ServeError(f"serve-reward: --max-batch and --batch-size must be >= 1 and --max-length >= 2, got "
                         f"{max_batch}, {batch_size}, {max_length}")
    scorer, info = load_scorer(model_uri, device, max_length, batch_size)
    app = make_app(scorer, token, max_batch, model_uri, info)
    where = "loopback only" if host in ("127.0.0.1", "::1", "localhost") else "reachable from other machines"
    print(f"serving {model_uri} ({info['source']}, {info['device']}) on http://{host}:{port}/score ({where}); "
          f"token from ${token_env}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="info")
    return 0
