"""A reward source behind an HTTP endpoint: `POST url` with `TextBatch.to_json()`, answer `{"scores": [...]}` (the
protocol of `rlhf serve-reward`; any server that speaks it will do).

Transient failures (connection errors, timeouts, HTTP 5xx and 429) are tried again with exponential backoff, up to
`retries` tries per request; any other 4xx fails at once: sending the same request again cannot fix it. A server's
`Retry-After` (seconds or an HTTP date) sets the wait instead, up to `RETRY_AFTER_CAP_S`; one that asks for longer
ends the call with its one-line error. `timeout_s` bounds each try from its start to the answer's last byte (a
server that trickles its answer is cut there, not at each read), and an answer is at most `MAX_ANSWER_BYTES`, so one
request takes at most retries x timeout_s + (retries - 1) x RETRY_AFTER_CAP_S. Redirects are
not followed, so the bearer token only ever goes to the configured host. The token is read from its environment
variable on every call and is kept nowhere else: not in the object, its repr, a log line or an error message. A key
the endpoint wants in its URL goes the same way: `${VAR}` in `url` is replaced from the environment on every call
(`https://judge/score?api_key=${JUDGE_KEY}`), and the URL in messages is redacted (`rlhf_lib.redaction`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from rlhf_lib.redaction import redact_text
from rlhf_lib.rewards.base import RewardError, TextBatch, check_scores

MAX_BACKOFF_S = 10.0
RETRY_AFTER_CAP_S = 30.0
MAX_ANSWER_BYTES = 64 << 20  # 64 MiB: a million scores as JSON take ~20 MB
EXCERPT_CHARS = 200
_log = logging.getLogger(__name__)
# RFC 6750 b64token: what a bearer token may hold. Anything else (a stray newline from `$(cat file)`) would make the
# HTTP library raise an error that quotes the header, token included.
_TOKEN = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _RetryableStatus(Exception):
    """An HTTP answer worth trying again (5xx, 429): raised inside the retry loop, turned into a RewardError after."""

    def __init__(self, response: httpx.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


class _TooLate(Exception):
    """The server's Retry-After is longer than this client waits (`RETRY_AFTER_CAP_S`)."""

    def __init__(self, response: httpx.Response, seconds: float):
        super().__init__(f"Retry-After {seconds:g} s")
        self.response, self.seconds = response, seconds


def retry_after_s(response: httpx.Response, now: float | None = None) -> float | None:
    """The wait a 429/503 answer's `Retry-After` header asks for, in seconds (delta-seconds or an HTTP date, RFC 9110
    10.2.3); None without one or when it cannot be read. Example: "Retry-After: 2" -> 2.0."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _within(seconds: float, fn):
    """`fn()` run on a daemon thread and waited for at most `seconds`: its value, its exception, or a ReadTimeout
    when the time is up (the thread notices its own deadline at the next chunk it reads and stops)."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    thread = threading.Thread(target=target, name="http-reward-try", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise httpx.ReadTimeout(f"no complete answer within {seconds:g} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpReward:
    """A `TextReward` that asks an HTTP endpoint for one score per row.

    `token_env`: the environment variable holding the bearer token (None: no Authorization header). `retries`: tries
    per request (at least 1). `batch_size`: rows per request (None: the whole batch in one request).
    """

    def __init__(self, name: str, url: str, token_env: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 verify_tls: bool = True, batch_size: int | None = None, backoff_s: float = 0.5):
        self.name, self.url, self.token_env = name, url, token_env
        self.timeout_s, self.retries, self.verify_tls, self.batch_size = timeout_s, retries, verify_tls, batch_size
        self.backoff_s = backoff_s
        self.source = f"reward {name!r} (http {redact_text(url)})"
        parts = urlsplit(_VAR.sub("x", url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RewardError(f"{self.source}: expected an http:// or https:// URL with a host, got {url!r}")
        if retries < 1 or timeout_s <= 0 or (batch_size is not None and batch_size < 1):
            raise RewardError(f"{self.source}: retries and batch_size must be >= 1 and timeout_s > 0, got "
                              f"retries={retries}, batch_size={batch_size}, timeout_s={timeout_s}")
        if token_env and parts.scheme == "http" and not _is_loopback(parts.hostname):
            _log.warning("%s: the bearer token from $%s goes over plain http to %s; anyone on the path can read it "
                         "(use https)", self.source, token_env, parts.hostname)
        if not verify_tls and parts.scheme == "https":
            _log.warning("%s: TLS certificate verification is off (verify_tls=False)", self.source)

    def __repr__(self) -> str:
        return (f"HttpReward(name={self.name!r}, url={redact_text(self.url)!r}, token_env={self.token_env!r}, "
                f"timeout_s={self.timeout_s}, retries={self.retries}, verify_tls={self.verify_tls}, "
                f"batch_size={self.batch_size})")

    def __call__(self, batch: TextBatch) -> list[float]:
        """One finite float per row of `batch`, in order; a `RewardError` naming this source on any failure."""
        n = len(batch)
        if n == 0:
            return []
        token = self._token()
        url = self._url()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        step = self.batch_size or n
        values: list[Any] = []
        with httpx.Client(timeout=self.timeout_s, verify=self.verify_tls, follow_redirects=False) as client:
            for start in range(0, n, step):
                part = _rows(batch, start, min(start + step, n))
                where = self.source if step >= n else f"{self.source}, rows {start}-{start + len(part) - 1}"
                scores = self._scores(client, url, part, headers, where, token)
                if not isinstance(scores, list):
                    raise RewardError(f"{where}: \"scores\" is {type(scores).__name__}, expected a list of "
                                      f"{len(part)} numbers")
                if len(scores) != len(part):
                    check_scores(scores, len(part), where)  # raises, naming both counts
                values += scores
        return check_scores(values, n, self.source)  # NaN and inf named by their row in the whole batch

    def _token(self) -> str | None:
        if not self.token_env:
            return None
        token = os.environ.get(self.token_env, "").strip()
        if not token:
            raise RewardError(f"{self.source}: environment variable {self.token_env} is not set (it must hold the "
                              "bearer token of the endpoint)")
        if not _TOKEN.match(token):
            raise RewardError(f"{self.source}: environment variable {self.token_env} holds characters a bearer "
                              "token cannot have (whitespace or a line break inside it?)")
        return token

    def _url(self) -> str:
        """`url` with each `${VAR}` taken from the environment now; a RewardError naming a variable that is unset."""
        def value(match: re.Match) -> str:
            if not (found := os.environ.get(match.group(1), "")):
                raise RewardError(f"{self.source}: environment variable {match.group(1)} (in the url) is not set")
            return found
        return _VAR.sub(value, self.url)

    def _scores(self, client: httpx.Client, url: str, part: TextBatch, headers: dict[str, str], where: str,
                token: str | None) -> Any:
        """The `scores` value of one request's answer, after retries; a RewardError on any failure."""
        try:  # encoded once, not on every try; a column value JSON cannot hold is named here, not as a TypeError
            content = json.dumps(part.to_json())
        except (TypeError, ValueError) as e:
            raise RewardError(f"{where}: the batch cannot be sent as JSON: {e}") from None
        headers = headers | {"Content-Type": "application/json"}
        tries = 0

        def read_all(deadline: float) -> httpx.Response:
            with client.stream("POST", url, content=content, headers=headers) as streamed:
                body = bytearray()
                for chunk in streamed.iter_bytes():
                    body += chunk
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout(f"the answer took over {self.timeout_s:g} s")
                    if len(body) > MAX_ANSWER_BYTES:
                        raise RewardError(f"{where}: the answer is over {MAX_ANSWER_BYTES >> 20} MiB")
                return httpx.Response(streamed.status_code, headers=streamed.headers, content=bytes(body),
                                      request=streamed.request)

        def post() -> httpx.Response:
            nonlocal tries
            tries += 1
            response = _within(self.timeout_s, lambda: read_all(time.monotonic() + self.timeout_s))
            if response.status_code == 429 or response.status_code >= 500:
                asked = retry_after_s(response)
                if asked is not None and asked > RETRY_AFTER_CAP_S:
                    raise _TooLate(response, asked)
                raise _RetryableStatus(response)
            return response

        backoff = wait_exponential(multiplier=self.backoff_s, max=MAX_BACKOFF_S)

        def wait(state: RetryCallState) -> float:
            e = state.outcome.exception() if state.outcome else None
            asked = retry_after_s(e.response) if isinstance(e, _RetryableStatus) else None
            return asked if asked is not None else backoff(state)

        def before_sleep(state: RetryCallState) -> None:
            _log.warning("%s: %s (try %d of %d), retrying in %.1f s", where,
                         _scrub(_describe(state.outcome.exception()), token), state.attempt_number, self.retries,
                         state.next_action.sleep)

        policy = Retrying(retry=retry_if_exception_type((httpx.TransportError, _RetryableStatus)),
                          stop=stop_after_attempt(self.retries), reraise=True, before_sleep=before_sleep, wait=wait)
        try:
            response = policy(post)
        except httpx.TimeoutException:
            raise RewardError(f"{where}: timed out after {_tries(tries)} of {self.timeout_s:g} s each "
                              "(raise timeout_s, or make the endpoint faster)") from None
        except _TooLate as e:
            raise RewardError(_scrub(f"{where}: {_describe_status(e.response)}; it asks to retry after "
                                     f"{e.seconds:g} s, longer than the {RETRY_AFTER_CAP_S:g} s this client waits",
                                     token)) from None
        except (httpx.TransportError, _RetryableStatus) as e:
            last = "answer" if isinstance(e, _RetryableStatus) else "error"
            raise RewardError(_scrub(f"{where}: gave up after {_tries(tries)}; last {last}: {_describe(e)}", token)
                              ) from None
        return self._read(response, where, token)

    def _read(self, response: httpx.Response, where: str, token: str | None) -> Any:
        if not response.is_success:
            hint = ""
            if response.is_redirect:
                hint = f" (redirects are not followed: use the final URL, {response.headers.get('location')})"
            elif response.status_code in (401, 403):
                hint = (f" (check the token in ${self.token_env})" if self.token_env
                        else " (the endpoint wants a token: set token_env)")
            raise RewardError(_scrub(f"{where}: {_describe_status(response)}{hint}", token))
        try:
            body = response.json()
        except ValueError:
            raise RewardError(_scrub(f"{where}: the answer is not JSON: {_excerpt(response)!r}", token)) from None
        if not isinstance(body, dict) or "scores" not in body:
            got = f"keys {sorted(body)}" if isinstance(body, dict) else type(body).__name__
            raise RewardError(f"{where}: the answer has no \"scores\" field (expected {{\"scores\": [...]}}, got "
                              f"{got})")
        return body["scores"]


def _rows(batch: TextBatch, start: int, stop: int) -> TextBatch:
    """Rows [start, stop) of `batch`, columns included."""
    return TextBatch(batch.prompts[start:stop], batch.completions[start:stop], batch.finished[start:stop],
                     {k: v[start:stop] for k, v in batch.columns.items()})


def _tries(n: int) -> str:
    return f"{n} tr{'y' if n == 1 else 'ies'}"


def _excerpt(response: httpx.Response) -> str:
    text = " ".join(response.text.split())
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def _describe_status(response: httpx.Response) -> str:
    excerpt = _excerpt(response)
    return f"HTTP {response.status_code} {response.reason_phrase}" + (f": {excerpt}" if excerpt else "")


def _describe(e: BaseException | None) -> str:
    if isinstance(e, _RetryableStatus):
        return _describe_status(e.response)
    if isinstance(e, httpx.ConnectError):
        return f"cannot connect ({e})"
    if isinstance(e, httpx.TimeoutException):
        return "timed out"
    return f"request failed ({type(e).__name__}: {e})"


def _scrub(text: str, token: str | None) -> str:
    """`text` with the token replaced by `***` and anything secret-shaped redacted: a server that echoes the
    request's headers or URL must not put them into an error message or a log line."""
    return redact_text(text.replace(token, "***") if token else text)
