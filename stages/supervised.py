"""Training the supervised stages (SFT, reward model) in the stage's own process, or in several under `accelerate
launch` (`stages.launch`), on one machine or several: the same loop, the same numbers."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rlhf_lib.config import ResourcesConfig
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.events import Sink, metrics_log
from rlhf_lib.model_dirs import save_model
from stages.launch import run_job
from stages.rendezvous import FollowerDone

if TYPE_CHECKING:
    from pydantic import BaseModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase



class Loop(NamedTuple):
    """A supervised stage's training loop, the entry point of a launched process, and how its trained model loads
    back. Each stage passes its own (`stages.sft`, `stages.reward`), so that this module imports neither loop and
    an edit to the reward model's code leaves SFT's cache key alone."""

    train: Callable[..., tuple[dict[str, float], Any]]
    entry: Callable[..., Any]
    load: Callable[[Path, Any], Any]


def numerics_section(resources: ResourcesConfig) -> dict[str, Any]:
    """The part of `resources` that changes a trained model, for the cache key: only a mixed precision. The
    process count and the Accelerate config do not (the same global batches, the same mean; float noise aside)."""
    return {} if resources.mixed_precision == "no" else {"resources": {"mixed_precision": resources.mixed_precision}}


def train_supervised(kind: str, loop: Loop, resources: ResourcesConfig, model: PreTrainedModel,
                     tokenizer: PreTrainedTokenizerBase, examples: list, train_cfg: BaseModel, sink: Sink,
                     torch_threads: int = 1, launch_id: str = "") -> tuple[PreTrainedModel, dict[str, float]]:
    """Train `model` with the `kind` ("sft" or "reward") stage's `loop`, its metrics to `sink`; returns the trained model and
    the final metrics. With several processes or machines the starting model is saved to a temporary directory,
    trained there by the launched processes, and loaded back.

    On several machines every node calls this with the same `launch_id` (`stages.rendezvous`); node 0 returns the
    model, a node with `resources.machine_rank` > 0 raises `FollowerDone` once its processes are through: the
    trained weights are on node 0 only."""
    train, entry, load = loop
    if resources.num_processes == 1 and resources.num_machines == 1:
        group = ProcessGroup(resources.mixed_precision, resources.device)
        final, _ = train(model, tokenizer, examples, train_cfg, metrics_log(sink), group,
                         resources.gradient_checkpointing)
        return model, final
    with tempfile.TemporaryDirectory(prefix=f"rlhf-{kind}-launch-") as tmp:
        workdir = Path(tmp)
        save_model(model, tokenizer, workdir / "init")
        job = {"config": train_cfg.model_dump(), "mixed_precision": resources.mixed_precision, "device": resources.device,
               "gradient_checkpointing": resources.gradient_checkpointing,
               "examples": [dataclasses.asdict(e) for e in examples]}
        run_job(entry, job, resources, workdir, sink, torch_threads, launch_id=launch_id)
        if resources.machine_rank > 0:
            raise FollowerDone(f"{kind}: machine_rank {resources.machine_rank} trained with node 0, which saves "
                               "the model")
        final = json.loads((workdir / "final.json").read_text())
        return load(workdir / "out", tokenizer), final
