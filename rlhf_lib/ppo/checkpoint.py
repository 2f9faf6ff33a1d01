"""Save and restore the whole training state of a `PPOTrainer`, without pickle.

Tensors go to safetensors files, everything else to one JSON file, so a checkpoint can be read by any tool and
loading one never runs code. A checkpoint is a directory:

    policy.safetensors     policy state dict (tied weights stored once; aliases in the file's metadata)
    value.safetensors      the critic's state dict: value model, value head, or empty (same layout)
    optimizer.safetensors  every tensor of `optimizer.state_dict()` (Adam moments, `step`, ...)
    rng.safetensors        torch global RNG, the trainer's `torch.Generator` (and CUDA RNGs when CUDA is in use)
    state.json             the rest: optimizer param groups and non-tensor state, numpy and python RNG states,
                           the prompt sampler (its `random.Random`, order and position), the KL controller,
                           the iteration, the last timings, the config (for reference) and the caller's `extra`

Restoring all of it into a trainer built with the same config and initial models makes the resumed run
bit-identical to an uninterrupted one (on CPU). The trainer keeps no running statistics besides `timings`;
callers with their own (e.g. an EMA of the reward) pass them as the JSON-able `extra` of `save_checkpoint`, and
`load_checkpoint` returns them.

A checkpoint is written into a temporary directory beside its final name and renamed into place, so a crash
never leaves a half-written checkpoint under the final name; `latest_checkpoint` picks the newest complete one.

This module holds the public API and does all file writing; the (de)serialisation of model, optimizer and RNG
states and the checks of what was read live in `rlhf_lib.ppo.state_io`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from rlhf_lib.ppo.state_io import (
    check_optimizer,
    decode_optimizer,
    encode_optimizer,
    load_module_state,
    module_state_tensors,
    numpy_rng_state,
    numpy_rng_tuple,
    python_rng_state,
    python_rng_tuple,
    require,
    restore_cuda_rng,
    torch_rng_tensors,
)

if TYPE_CHECKING:
    from rlhf_lib.ppo.trainer import PPOTrainer

FORMAT = "rlhf_lib.ppo.checkpoint/1"
POLICY_FILE = "policy.safetensors"
VALUE_FILE = "value.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
STATE_FILE = "state.json"
REQUIRED_FILES = (POLICY_FILE, VALUE_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE)

_ITER_DIR = re.compile(r"^iter_(\d+)$")


# ---------------------------------------------------------------------------------------------------------------
# public API


def checkpoint_dir(root: Path, iteration: int) -> Path:
    """The conventional directory of the checkpoint after `iteration` iterations: `root/iter_000010`."""
    return Path(root) / f"iter_{iteration:06d}"


def save_checkpoint(trainer: PPOTrainer, directory: Path, extra: dict[str, Any] | None = None) -> Path:
    """Write the complete training state of `trainer` into `directory` and return it.

    `extra` holds the caller's JSON-able running statistics; `load_checkpoint` returns it. The directory is built
    beside its final name and renamed into place; an existing checkpoint of the same name is replaced only once
    the new one is complete. Raises `TypeError` if `extra` (or any state) is not JSON-serialisable.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)

    # Everything is gathered (and JSON-encoded) before the first byte is written.
    opt_tensors: dict[str, Tensor] = {}
    state = {
        "format": FORMAT,
        "iteration": int(trainer.iteration),
        "optimizer": encode_optimizer(trainer.optimizer.state_dict(), opt_tensors),
        "kl_controller": {"class": type(trainer.kl_ctl).__name__, "state": trainer.kl_ctl.state_dict()},
        "trainer": trainer.extra_state(),
        "rng": {"python": python_rng_state(random.getstate()), "numpy": numpy_rng_state()},
        "sampler": {
            "rng": python_rng_state(trainer.sampler.rng.getstate()),
            "order": [int(i) for i in trainer.sampler.order],
            "pos": int(trainer.sampler.pos),
            "n_prompts": len(trainer.sampler.prompts),
        },
        "timings": {k: float(v) for k, v in getattr(trainer, "timings", {}).items()},
        "config": _config_json(trainer),
        "extra": dict(extra) if extra is not None else {},
    }
    state_text = json.dumps(state, indent=1)
    rng_tensors = torch_rng_tensors(trainer.generator)

    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        _save_module_state(trainer.m.policy.state_dict(), tmp / POLICY_FILE)
        _save_module_state(trainer.critic.module.state_dict(), tmp / VALUE_FILE)
        save_file(opt_tensors, str(tmp / OPTIMIZER_FILE))
        save_file(rng_tensors, str(tmp / RNG_FILE))
        (tmp / STATE_FILE).write_text(state_text, encoding="utf-8")  # last: its presence marks completeness
        for name in REQUIRED_FILES:
            _fsync(tmp / name)
        _move_into_place(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_checkpoint(trainer: PPOTrainer, directory: Path) -> dict[str, Any]:
    """Restore a checkpoint written by `save_checkpoint` into `trainer`; return the saved `extra` dict.

    `trainer` must have been built with the same config, prompts and model architectures. Every file and key is
    validated before anything is changed, so a bad checkpoint raises a `ValueError` naming the file or key and
    leaves the trainer as it was.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"checkpoint directory {directory} does not exist")
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise ValueError(f"checkpoint {directory} is incomplete: missing file {name}")

    state = _read_state(directory / STATE_FILE)
    policy_sd = load_module_state(trainer.m.policy, directory / POLICY_FILE)
    value_sd = load_module_state(trainer.critic.module, directory / VALUE_FILE)
    opt_sd = decode_optimizer(
        require(state, "optimizer", STATE_FILE),
        load_file(str(directory / OPTIMIZER_FILE)),
        directory / OPTIMIZER_FILE,
        f"{STATE_FILE} optimizer",
    )
    check_optimizer(trainer.optimizer, opt_sd, directory / OPTIMIZER_FILE)
    rng = load_file(str(directory / RNG_FILE))
    for key in ("torch_global", "generator"):
        if key not in rng:
            raise ValueError(f"{directory / RNG_FILE}: missing tensor {key!r}")
    kl = require(state, "kl_controller", STATE_FILE)
    if kl.get("class") != type(trainer.kl_ctl).__name__:
        raise ValueError(
            f"{directory / STATE_FILE}: kl_controller is a {kl.get('class')}, the trainer has a "
            f"{type(trainer.kl_ctl).__name__} (was adaptive_kl changed?)"
        )
    sampler = require(state, "sampler", STATE_FILE)
    if sampler.get("n_prompts") != len(trainer.sampler.prompts):
        raise ValueError(
            f"{directory / STATE_FILE}: sampler.n_prompts is {sampler.get('n_prompts')}, the trainer has "
            f"{len(trainer.sampler.prompts)} prompts"
        )
    extra_state = require(state, "trainer", STATE_FILE)
    for key in ("rm_offset", "reward_moments"):
        require(extra_state, key, f"{STATE_FILE} trainer")
    if (extra_state["reward_moments"] is None) != (trainer.reward_moments is None):
        raise ValueError(f"{directory / STATE_FILE}: reward whitening state does not match the trainer "
                         "(was ppo.whiten_rewards changed?)")
    py_rng = require(require(state, "rng", STATE_FILE), "python", f"{STATE_FILE} rng")
    np_rng = require(state["rng"], "numpy", f"{STATE_FILE} rng")

    # All validated: now mutate.
    trainer.m.policy.load_state_dict(policy_sd, strict=True)
    trainer.critic.module.load_state_dict(value_sd, strict=True)
    trainer.optimizer.load_state_dict(opt_sd)
    trainer.kl_ctl.load_state_dict(kl["state"])
    trainer.load_extra_state(extra_state)
    trainer.sampler.rng.setstate(python_rng_tuple(sampler["rng"]))
    trainer.sampler.order = [int(i) for i in sampler["order"]]
    trainer.sampler.pos = int(sampler["pos"])
    trainer.iteration = int(require(state, "iteration", STATE_FILE))
    trainer.timings = {k: float(v) for k, v in state.get("timings", {}).items()}
    random.setstate(python_rng_tuple(py_rng))
    np.random.set_state(numpy_rng_tuple(np_rng))
    torch.set_rng_state(rng["torch_global"])
    trainer.generator.set_state(rng["generator"])
    restore_cuda_rng(rng)
    return dict(state.get("extra", {}))


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint `root/iter_NNNNNN` (highest iteration with every file), or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in root.iterdir():
        match = _ITER_DIR.match(child.name)
        if match and child.is_dir() and is_complete(child):
            it = int(match.group(1))
            if best is None or it > best[0]:
                best = (it, child)
    return best[1] if best else None


def is_complete(directory: Path) -> bool:
    """Whether `directory` holds every file of a checkpoint."""
    return all((Path(directory) / name).is_file() for name in REQUIRED_FILES)


# ---------------------------------------------------------------------------------------------------------------
# writing


def _move_into_place(tmp: Path, directory: Path) -> None:
    """Rename the finished `tmp` to `directory`, replacing an existing checkpoint only after `tmp` is complete."""
    old: Path | None = None
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=directory.parent))
        os.replace(directory, old / directory.name)
    os.replace(tmp, directory)
    _fsync_dir(directory.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync(path: Path) -> None:
    """Flush a written file to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename) to disk where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _save_module_state(state_dict: dict[str, Tensor], path: Path) -> None:
    """Save a module state dict to safetensors, tied weights stored once (see `state_io.module_state_tensors`)."""
    tensors, metadata = module_state_tensors(state_dict)
    save_file(tensors, str(path), metadata=metadata)


def _config_json(trainer: PPOTrainer) -> Any:
    """The trainer's config as JSON (for reference only; loading does not apply it)."""
    cfg = getattr(trainer, "cfg", None)
    dump = getattr(cfg, "model_dump", None)
    return dump(mode="json") if dump is not None else None


# ---------------------------------------------------------------------------------------------------------------
# reading


def _read_state(path: Path) -> dict[str, Any]:
    """Parse and check state.json."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable checkpoint state ({e})") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else None
        raise ValueError(f"{path}: unknown checkpoint format {found!r}, expected {FORMAT!r}")
    return state
