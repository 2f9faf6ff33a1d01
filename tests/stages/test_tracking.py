"""Metric buffering and the retry policy: a store that fails for a while loses nothing; one that stays down fails the
stage naming it; the training loop never waits for it."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST
from tenacity import wait_none

from stages import retry, tracking
from stages.net import ServiceUnreachable
from stages.tracking import StageRun


@pytest.fixture(autouse=True)
def fast_policy(monkeypatch):
    """The retry policy without waits, giving up after 0.3 s of tries."""
    monkeypatch.setattr(retry, "WAIT", wait_none())
    monkeypatch.setattr(retry, "MAX_WAIT_S", 0.3)


class FlakyClient:
    """Fails `failures` times, then stores every batch it gets (a stand-in for the MLflow client)."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls = 0
        self.stored: list[tuple[str, int, float]] = []

    def log_batch(self, run_id, metrics=(), tags=()):
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise MlflowException("connection refused")
        self.stored += [(m.key, m.step, m.value) for m in metrics] + [(t.key, -1, t.value) for t in tags]


def _run(client) -> StageRun:
    run = StageRun.__new__(StageRun)  # no real run: this isolates the buffering logic
    run.client, run.run_id, run.stage, run._pending, run._next_send = client, "r1", "ppo", [], float("-inf")
    run._deferred = []
    return run


def test_transient_failures_buffer_and_lose_nothing():
    client = FlakyClient(failures=2)
    run = _run(client)
    for step in range(4):
        run.log_metrics({"objective/kl": float(step)}, step)
    run.flush()
    assert client.stored == [("objective/kl", s, float(s)) for s in range(4)]
    assert run._pending == []


def test_a_failed_send_in_the_loop_is_tried_once_then_not_before_the_backoff(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(tracking, "_clock", lambda: now[0])
    client = FlakyClient(failures=10**6)
    run = _run(client)
    run.log_metrics({"objective/kl": 1.0}, 0)
    assert client.calls == 1  # one try, no retry: the loop goes on at once
    for step in range(1, 5):
        now[0] += 1.0
        run.log_metrics({"objective/kl": 1.0}, step)
    assert client.calls == 1 and len(run._pending) == 5  # within the backoff nothing is tried
    client.failures = 0
    now[0] += tracking.SEND_BACKOFF_S
    run.log_metrics({"objective/kl": 1.0}, 5)
    assert client.calls == 2 and [s for _, s, _ in client.stored] == list(range(6)) and run._pending == []


def test_a_store_that_stays_down_fails_the_flush_naming_it():
    run = _run(FlakyClient(failures=10**6))
    run.log_metrics({"objective/kl": 1.0}, 0)
    with pytest.raises(ServiceUnreachable, match="MLflow tracking store .* did not answer"):
        run.flush()
    assert len(run._pending) == 1  # still buffered, never silently dropped


def test_a_wrong_request_is_not_retried():
    calls = []

    def missing():
        calls.append(1)
        raise MlflowException("no such model", error_code=RESOURCE_DOES_NOT_EXIST)

    with pytest.raises(MlflowException, match="no such model"):
        tracking.store_call("get", missing)
    assert calls == [1]


def test_loop_writes_wait_for_the_store_with_the_metrics(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(tracking, "_clock", lambda: now[0])
    client = FlakyClient(failures=10**6)
    run = _run(client)
    run.set_tags({"rlhf.alarm.nan": "iteration 0"}, wait=False)  # tried at once, fails, kept
    now[0] += 1.0
    run.set_tags({"rlhf.alarm.kl_blowup": "iteration 1"}, wait=False)  # within the backoff: kept, not tried
    assert client.calls == 1 and len(run._deferred) == 2
    client.failures = 0
    run.flush()
    assert [k for k, _, _ in client.stored] == ["rlhf.alarm.nan", "rlhf.alarm.kl_blowup"] and run._deferred == []


def test_metrics_are_sent_at_most_once_per_interval_all_of_them_in_order(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(tracking, "_clock", lambda: now[0])
    client = FlakyClient(failures=0)
    calls = []
    client.log_batch = lambda run_id, metrics=(), tags=(): calls.append([(m.key, m.step) for m in metrics])
    run = _run(client)
    run.log_metrics({"reward/loss": 1.0}, 0)  # the first call sends at once
    for step in range(1, 4):  # within SEND_EVERY_S of it: buffered
        now[0] += 0.2
        run.log_metrics({"reward/loss": 1.0}, step)
    assert calls == [[("reward/loss", 0)]]
    now[0] += tracking.SEND_EVERY_S
    run.log_metrics({"reward/loss": 1.0, "reward/accuracy": 0.5}, 4)
    assert calls[1] == [("reward/loss", 1), ("reward/loss", 2), ("reward/loss", 3), ("reward/loss", 4),
                        ("reward/accuracy", 4)]
    run.log_metrics({"reward/loss": 1.0}, 5)
    run.flush()  # the end of the stage sends the rest whatever the clock says
    assert calls[2] == [("reward/loss", 5)] and run._pending == []


def test_an_artifact_upload_sends_the_metrics_logged_before_it(monkeypatch, tmp_path):
    monkeypatch.setattr(tracking, "_clock", lambda: 0.0)
    client = FlakyClient(failures=0)
    client.log_artifacts = lambda run_id, local, path: client.stored.append(("artifact:" + path, -1, None))
    run = _run(client)
    run.log_metrics({"objective/kl": 1.0}, 0)
    run.log_metrics({"objective/kl": 2.0}, 1)  # same instant: buffered
    run.log_dir(tmp_path, "checkpoints/iter-2", wait=False)
    assert client.stored == [("objective/kl", 0, 1.0), ("objective/kl", 1, 2.0),
                             ("artifact:checkpoints/iter-2", -1, None)]


def test_other_writes_are_retried_then_fail_naming_the_store():
    client = FlakyClient(failures=2)
    _run(client).set_tags({"rlhf.alarm.kl_blowup": "iteration 3"})  # 2 failures, the 3rd try lands
    assert client.stored == [("rlhf.alarm.kl_blowup", -1, "iteration 3")]
    with pytest.raises(ServiceUnreachable, match="set_tags"):
        _run(FlakyClient(failures=10**6)).set_tags({"a": "b"})


def test_credentials_never_reach_params_or_tags():
    from stages.tracking import redact

    assert redact("model.name_or_path", "org/model") == "org/model"
    assert redact("hub_token", "anything") == "***" and redact("aws_secret_access_key", "x") == "***"
    assert redact("ppo.max_new_tokens", 12) == "12" and redact("tokenizer", "gpt2") == "gpt2"
    assert redact("note", "use hf_abcdefghijklmnopqrstuvwxyz0123 here") == "use *** here"
    assert redact("uri", "https://user:s3cret@host/x") == "https://***@host/x"
    assert redact("auth", "Bearer abc.def") == "Bearer ***"  # key matches nothing, but the value is a bearer token


def _locked():
    from sqlalchemy.exc import OperationalError
    return OperationalError("SELECT name FROM sqlite_master", {}, Exception("database is locked"))


def test_a_store_locked_for_a_moment_is_waited_for(monkeypatch):
    calls = []

    def ensure(uri):
        calls.append(uri)
        if len(calls) < 3:
            raise _locked()
        return "7"

    monkeypatch.setattr(tracking, "_ensure_experiment", ensure)
    assert tracking._open_sqlite_store("sqlite:////state/mlflow.db") == "7" and len(calls) == 3


def test_a_store_that_stays_locked_fails_naming_the_file(monkeypatch):
    monkeypatch.setattr(tracking, "_ensure_experiment", lambda uri: (_ for _ in ()).throw(_locked()))
    with pytest.raises(ServiceUnreachable, match=r"/state/mlflow\.db stayed locked by another process"):
        tracking._open_sqlite_store("sqlite:////state/mlflow.db")
