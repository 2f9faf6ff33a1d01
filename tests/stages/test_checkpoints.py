"""PPO checkpoints in the store: old ones pruned (`ppo.keep_checkpoints`) only once a newer one is complete, a failed
delete only warns; a resume downloads the newest complete checkpoint only, and the one before it only when the
newest does not load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rlhf_lib.config import PipelineConfig
from rlhf_lib.events import Checkpoint, Resumed
from rlhf_lib.ppo.loop import PPOJob
from stages import artifact_cache, ppo, ppo_sink
from stages.tracking import StageRun, setup_mlflow

KEY = "k" * 24


@pytest.fixture()
def exp_id(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ppo, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(ppo_sink, "get_run_logger", lambda: logging.getLogger("test"))
    return setup_mlflow()


def write_checkpoint(root: Path, iteration: int, complete: bool = True) -> Path:
    d = root / f"iter_{iteration:06d}"
    d.mkdir(parents=True)
    (d / "policy.safetensors").write_bytes(bytes([iteration]) * 64)
    if complete:
        (d / "COMPLETE").write_text(str(iteration))
    return d


def stored(run_id: str) -> dict[str, set[str]]:
    client = MlflowClient()
    return {f.path.split("/")[-1]: {g.path.split("/")[-1] for g in client.list_artifacts(run_id, f.path)}
            for f in client.list_artifacts(run_id, "checkpoints")}


def test_the_store_keeps_the_newest_checkpoints_and_the_work_dir_none(exp_id, tmp_path):
    run = StageRun(exp_id, "ppo", None, "ppo-prune", {})
    sink = ppo.PPORunSink(run, total=8, keep=2)
    work = tmp_path / "work" / "checkpoints"
    for it in (2, 4, 6, 8):
        sink.emit(Checkpoint(str(write_checkpoint(work, it)), it))
    # Deleted through MLflow's artifact repository API (`delete_artifacts`): the files are gone from the store.
    assert stored(run.run_id) == {n: {"policy.safetensors", "COMPLETE"} for n in ("iter_000006", "iter_000008")}
    assert list(work.iterdir()) == []  # each local copy is deleted once logged


class RecordingRun:
    """A stand-in for `StageRun` recording the sink's store calls in order; deletes fail `delete_failures` times."""

    stage = "ppo"

    def __init__(self, delete_failures: int = 0, upload_fails: bool = False):
        self.calls: list[str] = []
        self.delete_failures, self.upload_fails = delete_failures, upload_fails

    def log_dir(self, local_dir, artifact_path, wait=True):
        if self.upload_fails:
            raise ConnectionError("store down")
        self.calls.append(f"upload {artifact_path}")

    def log_text(self, text, artifact_file, wait=True):
        self.calls.append(f"marker {artifact_file.split('/')[1]}")

    def delete_artifacts(self, artifact_path, wait=True):
        if self.delete_failures:
            self.delete_failures -= 1
            raise ConnectionError("delete refused")
        self.calls.append(f"delete {artifact_path.split('/')[1]}")


def test_an_old_checkpoint_is_deleted_only_after_a_newer_one_is_complete(exp_id, tmp_path):
    run = RecordingRun()
    sink = ppo.PPORunSink(run, total=6, keep=1)
    for it in (2, 4):
        sink.emit(Checkpoint(str(write_checkpoint(tmp_path, it)), it))
    assert run.calls == ["upload checkpoints/iter_000002", "marker iter_000002",
                         "upload checkpoints/iter_000004", "marker iter_000004", "delete iter_000002"]
    run.upload_fails = True  # the newer one never reaches the store: the newest complete one stays
    sink.emit(Checkpoint(str(write_checkpoint(tmp_path, 6)), 6))
    assert run.calls[-1] == "delete iter_000002" and sink.logged == ["iter_000004"]


def test_a_failed_delete_warns_and_is_tried_after_the_next_checkpoint(exp_id, tmp_path, caplog):
    run = RecordingRun(delete_failures=1)
    sink = ppo.PPORunSink(run, total=6, keep=1)
    for it in (2, 4):
        sink.emit(Checkpoint(str(write_checkpoint(tmp_path, it)), it))
    assert "could not delete the old checkpoint iter_000002" in caplog.text
    assert sink.logged == ["iter_000002", "iter_000004"]
    sink.emit(Checkpoint(str(write_checkpoint(tmp_path, 6)), 6))
    assert [c for c in run.calls if c.startswith("delete")] == ["delete iter_000002", "delete iter_000004"]


def test_keep_none_keeps_every_checkpoint(exp_id, tmp_path):
    run = RecordingRun()
    sink = ppo.PPORunSink(run, total=6, keep=None)
    for it in (2, 4, 6):
        sink.emit(Checkpoint(str(write_checkpoint(tmp_path, it)), it))
    assert not [c for c in run.calls if c.startswith("delete")]


@pytest.fixture()
def interrupted(exp_id, tmp_path, monkeypatch):
    """An interrupted PPO run (left RUNNING) holding complete checkpoints 2 and 4 and an incomplete 6, a new run with
    the same key, and the downloads made from then on. The store is treated as remote, so each download is a real
    transfer (MLflow's own download) into the artifact cache."""
    old = StageRun(exp_id, "ppo", None, "ppo-old", {"rlhf.cache_key_pending": KEY})
    for it, complete in ((2, True), (4, True), (6, False)):
        old.log_dir(write_checkpoint(tmp_path / "old", it, complete), f"checkpoints/iter_{it:06d}")
    new = StageRun(exp_id, "ppo", None, "ppo-new", {"rlhf.cache_key_pending": KEY})
    transfers: list[str] = []
    real = artifact_cache.transfer
    monkeypatch.setattr(artifact_cache, "is_local", lambda location: False)
    monkeypatch.setattr(artifact_cache, "transfer",
                        lambda location, dst: (transfers.append(location.rsplit("/", 1)[-1]), real(location, dst))[1])
    return old, new, transfers


def fake_train(loads: set[str], tried: list[str]):
    """`train_ppo` that loads only the checkpoints named in `loads`, as the loop reports it."""

    def train(job, sink, workdir, call=None):
        if not job.resume:
            tried.append("afresh")
            return
        name = Path(job.resume[0]).name
        assert (Path(job.resume[0]) / "COMPLETE").is_file()
        tried.append(name)
        sink.emit(Resumed(name if name in loads else None, 4 if name in loads else 0))

    return train


def job() -> PPOJob:
    return PPOJob(config={}, sft_dir="", reward_dir="", prompts=[], out_dir="")


def test_resume_downloads_only_the_newest_complete_checkpoint(interrupted, monkeypatch):
    old, new, transfers = interrupted
    tried: list[str] = []
    monkeypatch.setattr(ppo, "train_ppo", fake_train({"iter_000004", "iter_000002"}, tried))
    ppo._train(PipelineConfig(), new, job())
    assert tried == ["iter_000004"] and transfers == ["iter_000004"]
    client = MlflowClient()
    assert client.get_run(new.run_id).data.tags["rlhf.resumed_from"] == f"{old.run_id}/checkpoints/iter_000004"
    assert client.get_run(old.run_id).info.status == "FAILED"
    assert list(artifact_cache.root().glob("*/iter_*")) == []  # the retired run's checkpoint left the cache


def test_an_older_checkpoint_is_downloaded_only_when_the_newest_does_not_load(interrupted, monkeypatch):
    _, new, transfers = interrupted
    tried: list[str] = []
    monkeypatch.setattr(ppo, "train_ppo", fake_train({"iter_000002"}, tried))
    ppo._train(PipelineConfig(), new, job())
    assert tried == ["iter_000004", "iter_000002"] and transfers == ["iter_000004", "iter_000002"]
    assert MlflowClient().get_run(new.run_id).data.tags["rlhf.resumed_from"].endswith("iter_000002")


def test_when_no_checkpoint_loads_the_loop_starts_afresh_and_the_old_run_is_retired(interrupted, monkeypatch):
    old, new, _ = interrupted
    tried: list[str] = []
    monkeypatch.setattr(ppo, "train_ppo", fake_train(set(), tried))
    ppo._train(PipelineConfig(), new, job())
    assert tried == ["iter_000004", "iter_000002", "afresh"]
    client = MlflowClient()
    assert client.get_run(old.run_id).info.status == "FAILED"
    assert "no checkpoint loaded" in client.get_run(old.run_id).data.tags["rlhf.resumed_by"]
