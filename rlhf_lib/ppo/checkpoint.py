"""Save and restore the whole training state of a `PPOTrainer`, without pickle.

Tensors go to safetensors files, everything else to one JSON file, so a checkpoint can be read by any tool and
loading one never runs code. A checkpoint is a directory:

    policy.safetensors     the policy's weights (`safetensors.torch.save_model`: tied weights stored once)
    value.safetensors      the critic's own weights: value model, value head, or none (same layout)
    optimizer.safetensors  the optimizer's tensors (Adam moments, `step`) as `state.<param index>.<key>`
    rng.safetensors        torch global RNG, the trainer's `torch.Generator` (and CUDA RNGs when CUDA is in use)
    best_policy.safetensors  with `ppo.keep: best` once an evaluation ran: the best policy so far (its weights as
                           saved for registering; which iteration and figure are in state.json)
    rollouts.safetensors   with `ppo.async_rollouts`: the rollouts already submitted to the sampler, sampled by
                           weights older than the checkpoint's (their prompts and versions are in state.json)
    state.json             the rest: the optimizer's other values, numpy and python RNG states, the prompt sampler,
                           the KL controller, the iteration, the trainer's running statistics, the config (for
                           reference) and the caller's `extra`
    COMPLETE               written last: a directory without it is a save that did not finish

The marker is the one crash-safety mechanism: locally, and in MLflow, where the stage uploads it after the other
files (`stages.ppo`). Restoring all of it into a trainer built with the same config and initial models makes the
resumed run bit-identical to an uninterrupted one (on CPU).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file, save_model
from torch import Tensor, nn

if TYPE_CHECKING:
    from rlhf_lib.ppo.trainer import PPOTrainer

FORMAT = "rlhf_lib.ppo.checkpoint/2"
POLICY_FILE, VALUE_FILE, OPTIMIZER_FILE = "policy.safetensors", "value.safetensors", "optimizer.safetensors"
RNG_FILE, STATE_FILE, COMPLETE_MARKER = "rng.safetensors", "state.json", "COMPLETE"
BEST_FILE = "best_policy.safetensors"  # optional: only with ppo.keep=best
ROLLOUTS_FILE = "rollouts.safetensors"  # optional: only with ppo.async_rollouts
FILES = (POLICY_FILE, VALUE_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE, COMPLETE_MARKER)
_ITER_DIR = re.compile(r"^iter_(\d+)$")


def checkpoint_dir(root: Path, iteration: int) -> Path:
    """The conventional directory of the checkpoint after `iteration` iterations: `root/iter_000010`."""
    return Path(root) / f"iter_{iteration:06d}"


def is_complete(directory: Path) -> bool:
    return (Path(directory) / COMPLETE_MARKER).is_file()


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint `root/iter_NNNNNN`, or None."""
    found = [(int(m.group(1)), p) for p in Path(root).glob("iter_*")
             if (m := _ITER_DIR.match(p.name)) and is_complete(p)]
    return max(found)[1] if found else None


def save_checkpoint(trainer: PPOTrainer, directory: Path, extra: dict[str, Any] | None = None) -> Path:
    """Write the complete training state of `trainer` into `directory`, the `COMPLETE` marker last; return it.

    `extra` holds the caller's JSON-able running statistics; `load_checkpoint` returns it. Raises `TypeError` if
    any state is not JSON-serialisable, before the first file is written.
    """
    directory = Path(directory)
    optimizer, opt_tensors = _split_optimizer(trainer.optimizer.state_dict())
    # Async rollouts: those in flight are waited for first, and saved (the sampler has drawn their prompts).
    pending, rollouts = trainer.queue.state() if trainer.queue is not None else ([], {})
    sampler = trainer.sampler
    state_text = json.dumps({
        "format": FORMAT,
        "iteration": trainer.iteration,
        "optimizer": optimizer,
        "kl_controller": {"class": type(trainer.kl_ctl).__name__, "state": trainer.kl_ctl.state_dict()},
        "trainer": trainer.extra_state(),
        "rng": {"python": random.getstate(), "numpy": _numpy_state()},
        "sampler": {"rng": sampler.rng.getstate(), "order": sampler.order, "pos": sampler.pos,
                    "n_prompts": len(sampler.prompts)},
        "config": trainer.cfg.model_dump(mode="json"),
        "extra": dict(extra or {}),
        "async_rollouts": pending,
    }, indent=1)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / COMPLETE_MARKER).unlink(missing_ok=True)  # an overwrite is incomplete until it is done
    save_model(trainer.models.policy, str(directory / POLICY_FILE))
    save_model(trainer.critic.module, str(directory / VALUE_FILE))
    save_file(opt_tensors, str(directory / OPTIMIZER_FILE))
    save_file(_torch_rng(trainer.generator), str(directory / RNG_FILE))
    if trainer.best is not None:
        save_file(trainer.best.state, str(directory / BEST_FILE))
    if rollouts:
        save_file(rollouts, str(directory / ROLLOUTS_FILE))
    (directory / STATE_FILE).write_text(state_text, encoding="utf-8")
    (directory / COMPLETE_MARKER).write_text(str(trainer.iteration))
    return directory


def load_checkpoint(trainer: PPOTrainer, directory: Path) -> dict[str, Any]:
    """Restore a checkpoint written by `save_checkpoint` into `trainer`; return the saved `extra` dict.

    `trainer` must have been built with the same config, prompts and model architectures. Every file and key is
    validated before anything is changed, so a bad checkpoint raises a `ValueError` naming the file or key and
    leaves the trainer as it was.
    """
    directory = Path(directory)
    for name in (COMPLETE_MARKER, *FILES[:-1]):
        if not (directory / name).is_file():
            raise ValueError(f"checkpoint {directory} is incomplete: missing file {name}")
    try:
        state = json.loads((directory / STATE_FILE).read_text(encoding="utf-8"))
        policy = _read_module(trainer.models.policy, directory / POLICY_FILE)
        value = _read_module(trainer.critic.module, directory / VALUE_FILE)
        optimizer = _join_optimizer(trainer.optimizer, state["optimizer"], load_file(str(directory / OPTIMIZER_FILE)),
                                    directory / OPTIMIZER_FILE)
        rng = load_file(str(directory / RNG_FILE))
        best = load_file(str(directory / BEST_FILE)) if state["trainer"].get("best") else None
        _check_state(trainer, state, rng, directory)
        pending = (state.get("async_rollouts") or []) if trainer.queue is not None else []
        rollouts = load_file(str(directory / ROLLOUTS_FILE)) if pending else {}
        if pending:
            trainer.queue.check_state(pending, rollouts, str(directory / ROLLOUTS_FILE))
    except (KeyError, TypeError, json.JSONDecodeError, SafetensorError, OSError) as e:
        raise ValueError(f"checkpoint {directory} is unreadable: {type(e).__name__}: {e}") from e

    # All validated: now mutate.
    trainer.models.policy.load_state_dict(policy, strict=True)
    trainer.critic.module.load_state_dict(value, strict=True)
    trainer.optimizer.load_state_dict(optimizer)
    trainer.kl_ctl.load_state_dict(state["kl_controller"]["state"])
    trainer.load_extra_state(state["trainer"], best)
    sampler = state["sampler"]
    trainer.sampler.rng.setstate(_python_state(sampler["rng"]))
    trainer.sampler.order, trainer.sampler.pos = list(sampler["order"]), sampler["pos"]
    trainer.iteration = state["iteration"]
    if trainer.queue is not None:  # a checkpoint of a synchronous run has none: the queue samples them afresh
        trainer.queue.load_state(pending, rollouts)
    random.setstate(_python_state(state["rng"]["python"]))
    np.random.set_state(tuple(state["rng"]["numpy"]))
    torch.set_rng_state(rng["torch_global"])
    trainer.generator.set_state(rng["generator"])
    cuda = [rng[k] for k in sorted((k for k in rng if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    return dict(state["extra"])


def _read_module(module: nn.Module, path: Path) -> dict[str, Tensor]:
    """A module's state dict from a `save_model` file, tied weights restored from the file's metadata (removed
    name -> kept name), checked against `module`: names, shapes and dtypes."""
    with safe_open(str(path), framework="pt") as f:
        aliases = f.metadata() or {}
    tensors = load_file(str(path))
    tensors.update({alias: tensors[kept] for alias, kept in aliases.items() if kept in tensors})
    expected = module.state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: parameter names do not match the model: missing {missing}, unexpected {unexpected}")
    for name, t in tensors.items():
        if t.shape != expected[name].shape or t.dtype != expected[name].dtype:
            raise ValueError(f"{path}: tensor {name!r} is {t.dtype} {tuple(t.shape)}, the model has "
                             f"{expected[name].dtype} {tuple(expected[name].shape)}")
    return tensors


def _split_optimizer(sd: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """`optimizer.state_dict()` as JSON (tensors replaced by null) and its tensors as `state.<index>.<key>`."""
    tensors = {f"state.{i}.{k}": v.detach().cpu().contiguous() for i, entry in sd["state"].items()
               for k, v in entry.items() if isinstance(v, Tensor)}
    state = {str(i): {k: None if isinstance(v, Tensor) else v for k, v in entry.items()}
             for i, entry in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}, tensors


def _join_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any], tensors: dict[str, Tensor],
                    path: Path) -> dict[str, Any]:
    """The inverse of `_split_optimizer`, checked against the live optimizer: groups, parameter counts, moment
    shapes. JSON turned tuples (Adam's betas) into lists: they get the live group's types back."""
    groups, live = saved["param_groups"], optimizer.param_groups
    if len(groups) != len(live) or any(len(g["params"]) != len(lg["params"]) for g, lg in zip(groups, live)):
        raise ValueError(f"{path}: the saved optimizer's parameter groups {[len(g['params']) for g in groups]} do not "
                         f"match the trainer's {[len(g['params']) for g in live]}")
    params = {i: p for g, lg in zip(groups, live) for i, p in zip(g["params"], lg["params"])}
    state: dict[int, dict[str, Any]] = {}
    for i, entry in saved["state"].items():
        if int(i) not in params:
            raise ValueError(f"{path}: optimizer state for unknown parameter index {i}")
        state[int(i)] = {k: tensors[f"state.{i}.{k}"] if v is None else v for k, v in entry.items()}
        for k, v in state[int(i)].items():
            if isinstance(v, Tensor) and v.dim() > 0 and v.shape != params[int(i)].shape:
                raise ValueError(f"{path}: tensor 'state.{i}.{k}' has shape {tuple(v.shape)}, its parameter has "
                                 f"{tuple(params[int(i)].shape)}")
    groups = [{k: tuple(v) if isinstance(lg.get(k), tuple) else v for k, v in g.items()} for g, lg in zip(groups, live)]
    return {"state": state, "param_groups": groups}


def _check_state(trainer: PPOTrainer, state: dict[str, Any], rng: dict[str, Tensor], directory: Path) -> None:
    """Everything besides the weights and the optimizer, against the live trainer."""
    where = directory / STATE_FILE
    if state.get("format") != FORMAT:
        raise ValueError(f"{where}: unknown checkpoint format {state.get('format')!r}, expected {FORMAT!r}")
    for key in ("torch_global", "generator"):
        if key not in rng:
            raise ValueError(f"{directory / RNG_FILE}: missing tensor {key!r}")
    kl = state["kl_controller"]["class"]
    if kl != type(trainer.kl_ctl).__name__:
        raise ValueError(f"{where}: kl_controller is a {kl}, the trainer has a {type(trainer.kl_ctl).__name__} "
                         "(was ppo.adaptive_kl changed?)")
    if state["sampler"]["n_prompts"] != len(trainer.sampler.prompts):
        raise ValueError(f"{where}: sampler.n_prompts is {state['sampler']['n_prompts']}, the trainer has "
                         f"{len(trainer.sampler.prompts)} prompts")
    if (state["trainer"]["reward_moments"] is None) != (trainer.reward_moments is None):
        raise ValueError(f"{where}: reward whitening state does not match the trainer (was ppo.whiten_rewards "
                         "changed?)")


def _torch_rng(generator: torch.Generator) -> dict[str, Tensor]:
    """The torch RNG states: global CPU, the trainer's generator, and each CUDA device's when CUDA is in use."""
    tensors = {"torch_global": torch.get_rng_state(), "generator": generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors.update({f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return tensors


def _python_state(saved: list[Any]) -> tuple[Any, ...]:
    """`random.getstate()` back from JSON: (version, the Mersenne-Twister words as a tuple, gauss_next)."""
    version, internal, gauss_next = saved
    return version, tuple(internal), gauss_next


def _numpy_state() -> list[Any]:
    """numpy's legacy global RNG state as JSON: (name, keys, pos, has_gauss, cached_gaussian)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
