"""The HTTP reward client against a real server on loopback: scores, the bearer token, batch splitting, retries of
transient failures only, and one clear error per way an endpoint can fail."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from rlhf_lib.rewards import RewardError, TextBatch
from rlhf_lib.rewards.http import HttpReward

TOKEN = "s3cret-Token_value"


class Handler(BaseHTTPRequestHandler):
    """One behaviour per path; every request is recorded as (path, Authorization header, body)."""

    seen: ClassVar[list[tuple[str, str | None, dict]]] = []

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def reply(self, status: int, body: str | bytes, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client timed out and left
            pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        auth = self.headers.get("Authorization")
        Handler.seen.append((self.path, auth, body))
        lengths = [float(len(c)) for c in body["completions"]]
        if self.path == "/score":
            self.reply(200, json.dumps({"scores": lengths}))
        elif self.path == "/slow":
            time.sleep(1.0)
            self.reply(200, json.dumps({"scores": lengths}))
        elif self.path == "/fail":
            self.reply(500, "model crashed: CUDA error")
        elif self.path == "/busy":  # 503 once, then fine: a retry succeeds
            busy = sum(p == "/busy" for p, _, _ in Handler.seen) == 1
            self.reply(503, "warming up") if busy else self.reply(200, json.dumps({"scores": lengths}))
        elif self.path == "/auth":
            self.reply(401, json.dumps({"detail": f"wrong token, you sent {auth}"}))
        elif self.path == "/count":
            self.reply(200, json.dumps({"scores": lengths[:-1]}))
        elif self.path == "/nan":  # NaN for the completion "xxx"
            self.reply(200, '{"scores": [' + ", ".join("NaN" if x == 3 else str(x) for x in lengths) + "]}")
        elif self.path == "/html":
            self.reply(200, "<html><body>Bad gateway page</body></html>", "text/html")
        elif self.path == "/noscores":
            self.reply(200, json.dumps({"rewards": lengths}))
        elif self.path == "/trickle":  # a valid answer, one byte every 0.3 s
            data = json.dumps({"scores": lengths}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif self.path.startswith("/later"):  # 503 with Retry-After: <the path's number> once, then fine
            first = sum(p == self.path for p, _, _ in Handler.seen) == 1
            if first:
                self.send_response(503)
                self.send_header("Retry-After", self.path.rsplit("/", 1)[-1])
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.reply(200, json.dumps({"scores": lengths}))
        elif self.path == "/moved":
            self.send_response(307)
            self.send_header("Location", "/score")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.reply(404, "not found")


@pytest.fixture(scope="module")
def base_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def token(monkeypatch):
    monkeypatch.setenv("JUDGE_TOKEN", TOKEN)
    Handler.seen.clear()


def batch(n: int = 3) -> TextBatch:
    return TextBatch([f"prompt {i}" for i in range(n)], ["x" * (i + 1) for i in range(n)],
                     [i % 2 == 0 for i in range(n)], {"answer": [str(i) for i in range(n)]})


def reward(url: str, **kw) -> HttpReward:
    kw = {"token_env": "JUDGE_TOKEN", "backoff_s": 0.01} | kw
    return HttpReward("judge", url, **kw)


def test_scores_and_bearer_token(base_url):
    assert reward(f"{base_url}/score")(batch()) == [1.0, 2.0, 3.0]
    ((_, auth, body),) = Handler.seen
    assert auth == f"Bearer {TOKEN}"
    assert body == batch().to_json()  # the whole TextBatch, columns included


def test_batch_split_into_requests(base_url):
    assert reward(f"{base_url}/score", batch_size=2)(batch(5)) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [len(body["prompts"]) for _, _, body in Handler.seen] == [2, 2, 1]
    assert [body["columns"]["answer"] for _, _, body in Handler.seen] == [["0", "1"], ["2", "3"], ["4"]]


def test_no_token_env_sends_no_header(base_url):
    assert HttpReward("judge", f"{base_url}/score")(batch(1)) == [1.0]
    assert Handler.seen[0][1] is None


def test_timeout_names_url_and_tries(base_url):
    start = time.monotonic()
    with pytest.raises(RewardError) as e:
        reward(f"{base_url}/slow", timeout_s=0.2, retries=2)(batch())
    assert time.monotonic() - start < 3
    assert str(e.value) == (f"reward 'judge' (http {base_url}/slow): timed out after 2 tries of 0.2 s each (raise "
                            "timeout_s, or make the endpoint faster)")
    assert len(Handler.seen) == 2


def test_server_error_is_retried_then_named(base_url):
    with pytest.raises(RewardError) as e:
        reward(f"{base_url}/fail", retries=3)(batch())
    assert len(Handler.seen) == 3
    assert str(e.value).endswith("/fail): gave up after 3 tries; last answer: HTTP 500 Internal Server Error: model "
                                 "crashed: CUDA error")
    assert f"{base_url}/fail" in str(e.value)


def test_transient_error_then_success(base_url):
    assert reward(f"{base_url}/busy")(batch()) == [1.0, 2.0, 3.0]
    assert len(Handler.seen) == 2


def test_unauthorized_is_not_retried_and_token_not_shown(base_url):
    r = reward(f"{base_url}/auth")
    with pytest.raises(RewardError) as e:
        r(batch())
    assert len(Handler.seen) == 1
    assert "HTTP 401 Unauthorized" in str(e.value) and "check the token in $JUDGE_TOKEN" in str(e.value)
    assert TOKEN not in str(e.value) and "Bearer ***" in str(e.value)  # the server echoed it; the message hides it
    assert TOKEN not in repr(r) and TOKEN not in str(vars(r))


def test_connection_refused(base_url):
    with pytest.raises(RewardError) as e:
        reward("http://127.0.0.1:9/score", retries=2)(batch())  # the discard port: nothing listens
    assert "http://127.0.0.1:9/score" in str(e.value) and "cannot connect" in str(e.value)
    assert "gave up after 2 tries; last error: cannot connect" in str(e.value)


@pytest.mark.parametrize(("path", "want"), [
    ("/count", "returned 2 scores for a batch of 3 rows"),
    ("/nan", "row 2: score nan is not finite"),
    ("/html", "the answer is not JSON: '<html><body>Bad gateway page</body></html>'"),
    ("/noscores", "the answer has no \"scores\" field (expected {\"scores\": [...]}, got keys ['rewards'])"),
    ("/missing", "HTTP 404 Not Found: not found"),
])
def test_bad_answers_are_named(base_url, path, want):
    with pytest.raises(RewardError) as e:
        reward(f"{base_url}{path}")(batch())
    assert str(e.value) == f"reward 'judge' (http {base_url}{path}): {want}"
    assert len(Handler.seen) == 1  # none of these is retried


def test_nan_row_counts_across_requests(base_url):
    with pytest.raises(RewardError, match=r"/nan\): row 2: score nan"):  # row 0 of the second request
        reward(f"{base_url}/nan", batch_size=2)(batch(5))


def test_missing_token_variable(base_url, monkeypatch):
    monkeypatch.delenv("JUDGE_TOKEN")
    with pytest.raises(RewardError) as e:
        reward(f"{base_url}/score")(batch())
    assert str(e.value) == (f"reward 'judge' (http {base_url}/score): environment variable JUDGE_TOKEN is not set "
                            "(it must hold the bearer token of the endpoint)")
    assert Handler.seen == []


def test_token_with_a_line_break_is_refused_without_showing_it(base_url, monkeypatch):
    monkeypatch.setenv("JUDGE_TOKEN", "abc\ndef")
    with pytest.raises(RewardError) as e:
        reward(f"{base_url}/score")(batch())
    assert "abc" not in str(e.value) and "JUDGE_TOKEN" in str(e.value)


@pytest.mark.parametrize("url", ["ftp://example.com/score", "http:///score", "example.com/score"])
def test_bad_url_refused_at_construction(url):
    with pytest.raises(RewardError, match="expected an http:// or https:// URL with a host"):
        HttpReward("judge", url)


def test_empty_batch_sends_nothing(base_url):
    assert reward(f"{base_url}/score")(TextBatch([], [], [])) == []
    assert Handler.seen == []


def test_unencodable_column_is_named(base_url):
    rows = TextBatch(["p"], ["c"], [True], {"when": [object()]})
    with pytest.raises(RewardError, match=r"/score\): the batch cannot be sent as JSON: Object of type object"):
        reward(f"{base_url}/score")(rows)
    assert Handler.seen == []


def test_redirect_is_not_followed(base_url):
    with pytest.raises(RewardError, match=r"HTTP 307 Temporary Redirect \(redirects are not followed: use the "
                       r"final URL, /score\)"):
        reward(f"{base_url}/moved")(batch())
    assert len(Handler.seen) == 1  # the token went nowhere else


def test_a_trickling_answer_is_cut_at_timeout_s_in_total(base_url):
    # Each byte comes well within timeout_s, the whole answer (~30 bytes, 9 s) does not: cut at 1 s a try.
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"timed out after 2 tries of 1 s each"):
        reward(base_url + "/trickle", timeout_s=1.0, retries=2)(batch())
    assert time.monotonic() - t0 < 4.0


def test_retry_after_is_honoured(base_url):
    t0 = time.monotonic()
    assert reward(base_url + "/later/1", backoff_s=0.0)(batch()) == [1.0, 2.0, 3.0]
    assert time.monotonic() - t0 >= 1.0  # waited what the server asked, not the 0 s backoff
    assert [p for p, _, _ in Handler.seen] == ["/later/1", "/later/1"]


def test_retry_after_beyond_the_cap_ends_the_call_with_one_line(base_url):
    t0 = time.monotonic()
    with pytest.raises(RewardError) as info:
        reward(base_url + "/later/3600")(batch())
    assert str(info.value) == (f"reward 'judge' (http {base_url}/later/3600): HTTP 503 Service Unavailable; it asks "
                               "to retry after 3600 s, longer than the 30 s this client waits")
    assert time.monotonic() - t0 < 2.0 and len(Handler.seen) == 1


def test_retry_after_as_an_http_date():
    import httpx

    from rlhf_lib.rewards.http import retry_after_s

    at = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"})
    assert retry_after_s(at, now=1792567670.0) == 10.0
    assert retry_after_s(httpx.Response(503, headers={"Retry-After": "soon"})) is None
    assert retry_after_s(httpx.Response(503)) is None
