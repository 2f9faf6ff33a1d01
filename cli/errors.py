"""Errors a user can act on: which exceptions are the user's to fix, and the one message each prints.

Everything else is a bug or a crash and keeps its traceback. The same types are kept off the terminal while Prefect
logs a failed run (`quiet_user_errors`): the stage's run in the UI still records the failure, and the command then
prints its one message.
"""

from __future__ import annotations

import logging
import re
import sys

from flows.placement import PlacementError
from rlhf_lib.config import ConfigError
from rlhf_lib.data import DataError
from rlhf_lib.memory import MemoryBudgetError
from rlhf_lib.model_import import ModelImportError
from rlhf_lib.rewards.base import RewardError
from stages.launch import LaunchError
from stages.net import ArtifactNotFound, ServiceUnreachable

USER_ERRORS = (ConfigError, DataError, ArtifactNotFound, ServiceUnreachable, LaunchError, FloatingPointError,
               RewardError, PlacementError, ModelImportError)
# What shrinks each stage's memory, largest savings first (see `rlhf_lib.memory` and `rlhf plan`).
OOM_KEYS = {
    "sft": "sft.batch_size, sft.max_length, resources.gradient_checkpointing=true, resources.num_processes",
    "reward": "reward.batch_size, reward.max_length, resources.gradient_checkpointing=true, reward.eval_batch_size",
    "ppo": "ppo.micro_batch_tokens / ppo.gradient_accumulation_steps, ppo.gradient_checkpointing=true, "
           "ppo.logprob_chunk, ppo.score_batch_size, ppo.batch_size, resources.frozen_dtype=bfloat16, ppo.lora=true, "
           "ppo.critic=shared or ppo.advantage_estimator=grpo",
    "eval": "eval.batch_size, eval.max_new_tokens",
    "dpo": "dpo.batch_size, dpo.max_length, resources.gradient_checkpointing=true, dpo.lora=true, "
           "dpo.eval_batch_size",
}
# torch's headline in a launched process's stderr: "torch.OutOfMemoryError: CUDA out of memory. Tried to ...".
_OOM_LINE = re.compile(r"(torch\.(cuda\.)?OutOfMemoryError|CUDA out of memory).*")


def out_of_memory(e: BaseException) -> str | None:
    """torch's one-line headline when `e` is, wraps or was caused by a device out-of-memory error (raised here, or
    quoted in a launched process's failure); None otherwise."""
    torch = sys.modules.get("torch")  # not imported: no torch error can have been raised
    seen: BaseException | None = e
    while seen is not None:
        if torch is not None and isinstance(seen, torch.OutOfMemoryError):
            return (str(seen).strip().splitlines() or ["CUDA out of memory"])[0]
        if isinstance(seen, LaunchError) and (found := _OOM_LINE.search(str(seen))):
            return found.group(0)
        seen = seen.__cause__ or seen.__context__
    return None


def oom_message(headline: str) -> str:
    """The refusal of a stage that ran out of device memory: torch's headline and the keys that shrink each stage."""
    keys = "\n".join(f"  {stage}: {text}" for stage, text in OOM_KEYS.items())
    return (f"out of device memory: {headline}\nThe keys that shrink a stage's memory, largest savings first:\n{keys}"
            "\n`rlhf plan` with the same --preset/--config/--set estimates each stage's memory before a run.")


def user_error(e: BaseException) -> str | None:
    """The message to print for an error the user can act on; None for anything else (it keeps its traceback)."""
    if isinstance(e, MemoryBudgetError):
        return f"out of memory: {e}"
    if (headline := out_of_memory(e)) is not None:
        return oom_message(headline)
    if isinstance(e, ConfigError):
        return f"bad config: {e}"
    if isinstance(e, DataError):
        message = f"bad data: {e}"
        if e.bad_rows:
            message += (f"\n  {e.bad_rows} of the {e.rows} rows of {e.path} are bad; to skip them (each reason is "
                        "counted in the data run's metrics), add --set data.on_bad_row=skip")
        return message
    if isinstance(e, LaunchError):
        return f"the training processes failed: {e}"
    if isinstance(e, FloatingPointError):
        return f"training diverged: {e}"
    if isinstance(e, RewardError):
        return f"a reward source failed (the iteration was not applied; rerun to resume from the last checkpoint): {e}"
    if isinstance(e, ModelImportError):
        return f"cannot import the model: {e}"
    if isinstance(e, USER_ERRORS):
        return str(e)
    return None


def _is_user_error(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and out_of_memory(exc) is not None:
        return True
    while exc is not None:
        if isinstance(exc, USER_ERRORS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class QuietUserErrors(logging.Filter):
    """Drops log records that carry a user error's traceback (Prefect's "Encountered exception during execution"
    of each failing flow and task run) from a console handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_user_error(record)


def quiet_user_errors() -> None:
    """Attach `QuietUserErrors` to the console handlers of the root logger (where Prefect's console handler sits)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not any(isinstance(f, QuietUserErrors)
                                                                   for f in handler.filters):
            handler.addFilter(QuietUserErrors())
