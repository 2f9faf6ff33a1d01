"""The PPO loop's sink (`PPORunSink`): the stage run's sink, plus checkpoints logged to the MLflow run as they
come (older ones pruned) and a resume's bookkeeping."""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import get_run_logger

from rlhf_lib.events import Checkpoint, Event, Resumed
from rlhf_lib.ppo.checkpoint import COMPLETE_MARKER
from stages.base import RunSink
from stages.resume import CheckpointRejected, resumed
from stages.retry import transient
from stages.tracking import StageRun


class PPORunSink(RunSink):
    """The PPO loop's sink: the stage run's sink, plus checkpoints (logged under `checkpoints/iter_NNNNNN/`, then
    deleted locally) and a resume (the interrupted run `resumed_from` retired, its metric history copied; a
    checkpoint that did not load raises `CheckpointRejected`).

    A checkpoint upload is tried once, so the loop never waits for a store that is down: one that fails stays on
    local disk until the next checkpoint replaces it, or until `close` uploads it by the retry policy. Once a
    checkpoint is logged whole (its marker is up), the run's checkpoints older than the newest `keep` are deleted
    from the store (`ppo.keep_checkpoints`; None keeps all); a failed delete warns and is tried after the next."""

    def __init__(self, run: StageRun, total: int, resumed_from: str | None = None, keep: int | None = None):
        super().__init__(run, total)
        self.resumed_from, self.keep = resumed_from, keep
        self.pending: Path | None = None
        self.logged: list[str] = []  # this run's checkpoints complete in the store, oldest first

    def emit(self, event: Event) -> None:
        match event:
            case Checkpoint(path, _):
                if self.pending is not None:  # superseded before the store came back
                    shutil.rmtree(self.pending, ignore_errors=True)
                self.pending = Path(path)
                try:
                    self._log_checkpoint(wait=False)
                except Exception as e:
                    if not transient(e):
                        raise
                    get_run_logger().warning("MLflow unreachable: checkpoint %s kept on local disk, to be logged "
                                             "later (%s)", self.pending.name, e)
            case Resumed(None, _):
                raise CheckpointRejected(f"a checkpoint of run {self.resumed_from} did not load")
            case Resumed(checkpoint, iteration):
                resumed(self.run, self.resumed_from, checkpoint, iteration)
                get_run_logger().info("ppo: resumed an interrupted run at iteration %d", iteration)
            case _:
                super().emit(event)

    def _log_checkpoint(self, wait: bool) -> None:
        name = self.pending.name
        # The marker goes last: a process killed while the files were being copied leaves none, and resume skips
        # that checkpoint.
        (self.pending / COMPLETE_MARKER).unlink(missing_ok=True)
        self.run.log_dir(self.pending, f"checkpoints/{name}", wait=wait)
        self.run.log_text(name, f"checkpoints/{name}/{COMPLETE_MARKER}", wait=wait)
        shutil.rmtree(self.pending, ignore_errors=True)
        self.pending = None
        self.logged.append(name)
        self._prune(wait)

    def _prune(self, wait: bool) -> None:
        """Delete this run's checkpoints beyond the newest `keep` from the store: called only after a newer one is
        complete there, so the newest complete one always stays."""
        while self.keep is not None and len(self.logged) > self.keep:
            name = self.logged[0]
            try:
                self.run.delete_artifacts(f"checkpoints/{name}", wait=wait)
            except Exception as e:  # a leftover checkpoint costs storage, never the run
                get_run_logger().warning("ppo: could not delete the old checkpoint %s from the MLflow run (tried again "
                                         "after the next one): %s", name, e)
                return
            self.logged.pop(0)

    def close(self) -> None:
        """After the loop: a checkpoint the store missed is logged now, waiting for the store by the retry policy."""
        if self.pending is not None:
            self._log_checkpoint(wait=True)
