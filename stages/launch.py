"""Running SFT or reward-model training in this process, or under `accelerate launch` in several; and the
launching of PPO (whose parent and worker halves are stages.ppo and stages.ppo_loop).

`train_supervised` is what the SFT and RM stages call. With `resources.num_processes == 1` it trains in the
stage's own process. With more, it writes the starting model and a job file to a temporary directory, runs
`accelerate launch -m stages.launch JOB` (the worker half of this module, which imports neither Prefect nor
MLflow), forwards the metrics the main process appends to a JSONL file to the stage's `log` as they come, and
loads the trained model back. The stage then logs and registers it as usual; a launch that fails raises with the
tail of its stderr, so nothing is registered. `run_job` is the launching itself, for any job kind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf_lib.config import ResourcesConfig

if TYPE_CHECKING:
    from pydantic import BaseModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

PROJECT = Path(__file__).resolve().parent.parent
CONFIG_DIR = PROJECT / "configs" / "accelerate"
STDERR_TAIL = 60  # lines of the workers' stderr quoted in a launch error
LogFn = Callable[[int, dict[str, float]], None]
Handler = Callable[[dict[str, Any]], None]


class LaunchError(RuntimeError):
    """`accelerate launch` ended with an error; the message quotes its command and the tail of its stderr."""


def numerics_section(resources: ResourcesConfig) -> dict[str, Any]:
    """The part of `resources` that changes a trained model, for the cache key: only a mixed precision. The
    process count and the Accelerate config do not (the same global batches, the same mean; float noise aside)."""
    return {} if resources.mixed_precision == "no" else {"resources": {"mixed_precision": resources.mixed_precision}}


def train_supervised(
    kind: str,
    resources: ResourcesConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: list,
    train_cfg: BaseModel,
    log: LogFn,
    torch_threads: int = 1,
) -> tuple[PreTrainedModel, dict[str, float]]:
    """Train `model` with the `kind` ("sft" or "reward") loop; returns the trained model and the final metrics."""
    from rlhf_lib.distributed import Distributed

    if resources.num_processes == 1:
        dist = Distributed(resources.mixed_precision, resources.gradient_checkpointing)
        return model, _trainer(kind)(model, tokenizer, examples, train_cfg, log, dist)
    return launch(kind, resources, model, tokenizer, examples, train_cfg, log, torch_threads)


def resolve_config(resources: ResourcesConfig) -> Path:
    """The Accelerate config file: as given (working directory, then configs/accelerate/), else the default."""
    import torch
    import yaml

    name = resources.accelerate_config or ("ddp.yaml" if torch.cuda.is_available() else "cpu_gloo.yaml")
    path = next((p.resolve() for p in (Path(name), CONFIG_DIR / name) if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(f"resources.accelerate_config: no file {name!r} in {Path.cwd()} or {CONFIG_DIR}")
    machines = (yaml.safe_load(path.read_text()) or {}).get("num_machines", 1)
    if machines != 1:
        raise ValueError(f"resources.accelerate_config {path}: num_machines is {machines}; a stage launches only "
                         "this machine's processes (multi-node launching is not wired yet)")
    return path


def launch(kind, resources, model, tokenizer, examples, train_cfg, log, torch_threads=1, workdir: Path | None = None):
    """Train in `resources.num_processes` processes under `accelerate launch`; see the module docstring."""
    import tempfile

    from stages.models_io import save_model

    with tempfile.TemporaryDirectory(prefix=f"rlhf-{kind}-launch-", dir=workdir) as tmp:
        tmp = Path(tmp)
        save_model(model, tokenizer, tmp / "init")
        job = {"kind": kind, "train_cfg": train_cfg.model_dump(), "mixed_precision": resources.mixed_precision,
               "gradient_checkpointing": resources.gradient_checkpointing,
               "examples": [dataclasses.asdict(e) for e in examples]}
        run_job(job, resources, tmp, lambda row: log(row["step"], row["metrics"]), torch_threads)
        final = json.loads((tmp / "final.json").read_text())
        return _load(kind, tmp / "out", tokenizer), final


def run_job(job: dict[str, Any], resources: ResourcesConfig, tmp: Path, handle: Handler, torch_threads: int = 1,
            mixed_precision: str | None = None) -> None:
    """Run `accelerate launch -m stages.launch` with `resources.num_processes` processes on `job` (written to
    tmp/job.json, with `dir` and `threads` added), passing each JSON line the main process appends to
    tmp/metrics.jsonl to `handle` as it comes. Raises `LaunchError` when the launch fails."""
    config_file = resolve_config(resources)
    precision = mixed_precision or resources.mixed_precision
    job = {**job, "dir": str(tmp), "threads": max(1, torch_threads // resources.num_processes)}
    (tmp / "job.json").write_text(json.dumps(job))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
           "--num_processes", str(resources.num_processes), "--main_process_port", str(_free_port()),
           "--mixed_precision", precision, "-m", "stages.launch", str(tmp / "job.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    _run(cmd, env, tmp, handle)


def _run(cmd: list[str], env: dict[str, str], tmp: Path, handle: Handler) -> None:
    """Run the launcher, forwarding its lines while it runs; on failure raise with its stderr tail."""
    metrics = tmp / "metrics.jsonl"
    metrics.touch()
    with open(tmp / "stdout.log", "wb") as out, open(tmp / "stderr.log", "wb") as err, open(metrics) as feed:
        # Its own session, so that an interrupted stage can stop every worker the launcher started.
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
        try:
            while proc.poll() is None:
                _forward(feed, handle)
                time.sleep(0.5)
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
        _forward(feed, handle)
    if proc.returncode != 0:
        lines = (tmp / "stderr.log").read_text(errors="replace").splitlines()
        raise LaunchError(f"`{' '.join(cmd[1:])}` exited with {proc.returncode}: {root_cause(lines)}\n"
                          "last lines of its stderr:\n" + "\n".join(lines[-STDERR_TAIL:]))


def root_cause(lines: list[str]) -> str:
    """The first worker's exception line (torchrun prefixes a worker's stderr with `[rankN]: `), else the
    launcher's own last one: the headline of a launch error."""
    exc = re.compile(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception|Interrupt)\b.*")
    found = [ln for ln in lines if exc.match(ln) and "ChildFailedError" not in ln]
    ranked = [ln for ln in found if ln.startswith("[rank")]
    return (ranked or found or ["(no exception line in stderr)"])[0]


def _forward(feed, handle: Handler) -> None:
    """Pass on every complete line the worker has appended since the last call."""
    while True:
        pos = feed.tell()
        line = feed.readline()
        if not line.endswith("\n"):  # nothing new, or a line still being written: read it next time
            feed.seek(pos)
            return
        handle(json.loads(line))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trainer(kind: str):
    from rlhf_lib.reward import train_reward_model
    from rlhf_lib.sft import train_sft

    return {"sft": train_sft, "reward": train_reward_model}[kind]


def _load(kind: str, path: Path, tokenizer):
    from rlhf_lib.models import build_policy, build_scalar_model

    return build_policy(tokenizer, str(path)) if kind == "sft" else build_scalar_model(path)


# The worker: one per process under `accelerate launch -m stages.launch JOB`. ---------------------------------

def worker(job_path: Path) -> None:
    from rlhf_lib.config import RewardConfig, SFTConfig
    from rlhf_lib.data.records import RankedExample, SFTExample
    from rlhf_lib.distributed import Distributed
    from rlhf_lib.models import load_tokenizer
    from rlhf_lib.process import configure_process

    job = json.loads(job_path.read_text())
    tmp, kind = Path(job["dir"]), job["kind"]
    if kind == "ppo":
        from stages.ppo_loop import worker as ppo_worker

        return ppo_worker(job)
    configure_process(job["threads"])
    record, cfg_cls = {"sft": (SFTExample, SFTConfig), "reward": (RankedExample, RewardConfig)}[kind]
    examples = [record(**{k: tuple(v) if isinstance(v, list) else v for k, v in e.items()}) for e in job["examples"]]
    tokenizer = load_tokenizer(tmp / "init")
    model = _load(kind, tmp / "init", tokenizer)
    dist = Distributed(job["mixed_precision"], job["gradient_checkpointing"])
    with open(tmp / "metrics.jsonl", "a") as feed:
        def log(step: int, metrics: dict[str, float]) -> None:
            feed.write(json.dumps({"step": step, "metrics": metrics}) + "\n")
            feed.flush()

        final = _trainer(kind)(model, tokenizer, examples, cfg_cls(**job["train_cfg"]), log, dist)
    state = dist.full_state_dict()  # every process takes part in gathering the shards
    if dist.is_main:
        dist.unwrapped().save_pretrained(tmp / "out", state_dict=state, safe_serialization=True)
        (tmp / "final.json").write_text(json.dumps(final))
    dist.acc.wait_for_everyone()
    dist.acc.end_training()


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
