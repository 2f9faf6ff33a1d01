"""The one retry policy of the pipeline's MLflow calls (tenacity), and the client settings it relies on.

MLflow's own HTTP client retries each request up to 7 times with exponential backoff by default (over four minutes
against a dead server), inside any retry of ours. Here its retries are off (`MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`)
and each request times out after `MLFLOW_HTTP_REQUEST_TIMEOUT` seconds (unless you set either variable), so this
policy is the only one: an MLflow write that fails transiently is tried again with exponential backoff (1, 2, 4,
8, 15, 15 ... s) for up to `MAX_WAIT_S`, then the stage fails naming the store. The worst case for one call is
`MAX_WAIT_S` plus one request timeout. The PPO loop's metric sends and checkpoint uploads do not wait at all:
they try once and keep what failed for later (`stages.tracking.StageRun`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import mlflow
from mlflow.protos.databricks_pb2 import (
    INVALID_PARAMETER_VALUE,
    RESOURCE_ALREADY_EXISTS,
    RESOURCE_DOES_NOT_EXIST,
    ErrorCode,
)
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

T = TypeVar("T")
MAX_WAIT_S = 60.0
WAIT = wait_exponential(min=1, max=15)
REQUEST_TIMEOUT_S = 20
_log = logging.getLogger(__name__)
# MLflow errors that no retry can fix: the request itself is wrong.
_PERMANENT = {ErrorCode.Name(c) for c in (RESOURCE_DOES_NOT_EXIST, INVALID_PARAMETER_VALUE, RESOURCE_ALREADY_EXISTS)}


def configure_client() -> None:
    """MLflow's client without retries of its own, with a request timeout, and with proxied artifacts moved through
    the tracking server rather than presigned S3 URLs (the bundled moto store checks keys and fails a presigned
    request: `services.s3_auth`). A user's setting wins each time."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(REQUEST_TIMEOUT_S))
    os.environ.setdefault("MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD", "false")
    os.environ.setdefault("MLFLOW_ENABLE_PROXY_MULTIPART_UPLOAD", "false")


def transient(e: BaseException) -> bool:
    """Whether a store that is down for a moment explains `e`: connection errors and timeouts, and MLflow errors
    other than a wrong request (a missing file or entity is no reason to wait)."""
    import requests

    if isinstance(e, mlflow.exceptions.MlflowException):
        return e.error_code not in _PERMANENT
    return isinstance(e, (ConnectionError, TimeoutError, requests.exceptions.RequestException))


def retrying(what: str, fn: Callable[..., T], *args: Any, retry_on: Callable[[BaseException], bool] = transient,
             **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, tried again on errors `retry_on` accepts, with exponential backoff (`WAIT`) for up to
    `MAX_WAIT_S`; the last error is raised."""
    policy = Retrying(retry=retry_if_exception(retry_on), wait=WAIT, stop=stop_after_delay(MAX_WAIT_S), reraise=True,
                      before_sleep=lambda state: _log.warning("MLflow %s failed, retrying in %.0f s: %s", what,
                                                              state.next_action.sleep, state.outcome.exception()))
    return policy(fn, *args, **kwargs)
