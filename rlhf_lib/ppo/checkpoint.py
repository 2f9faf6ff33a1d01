"""Save and restore the whole training state of a `PPOTrainer`, without pickle.

Tensors go to safetensors files, everything else to one JSON file, so a checkpoint can be read by any tool and
loading one never runs code. A checkpoint is a directory:

    policy.safetensors     policy state dict (tied weights stored once; aliases in the file's metadata)
    value.safetensors      value-model state dict (same layout)
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
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

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
_ALIASES_KEY = "aliases"  # safetensors metadata key: JSON {alias name: stored name} of tied weights


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
        "optimizer": _encode_optimizer(trainer.optimizer.state_dict(), opt_tensors),
        "kl_controller": {"class": type(trainer.kl_ctl).__name__, "state": trainer.kl_ctl.state_dict()},
        "rng": {"python": _python_rng_state(random.getstate()), "numpy": _numpy_rng_state()},
        "sampler": {
            "rng": _python_rng_state(trainer.sampler.rng.getstate()),
            "order": [int(i) for i in trainer.sampler.order],
            "pos": int(trainer.sampler.pos),
            "n_prompts": len(trainer.sampler.prompts),
        },
        "timings": {k: float(v) for k, v in getattr(trainer, "timings", {}).items()},
        "config": _config_json(trainer),
        "extra": dict(extra) if extra is not None else {},
    }
    state_text = json.dumps(state, indent=1)
    rng_tensors = _torch_rng_tensors(trainer.generator)

    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        _save_module_state(trainer.m.policy.state_dict(), tmp / POLICY_FILE)
        _save_module_state(trainer.m.value.state_dict(), tmp / VALUE_FILE)
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
    policy_sd = _load_module_state(trainer.m.policy, directory / POLICY_FILE)
    value_sd = _load_module_state(trainer.m.value, directory / VALUE_FILE)
    opt_sd = _decode_optimizer(
        _require(state, "optimizer", STATE_FILE), load_file(str(directory / OPTIMIZER_FILE)), directory
    )
    _check_optimizer(trainer.optimizer, opt_sd, directory / OPTIMIZER_FILE)
    rng = load_file(str(directory / RNG_FILE))
    for key in ("torch_global", "generator"):
        if key not in rng:
            raise ValueError(f"{directory / RNG_FILE}: missing tensor {key!r}")
    kl = _require(state, "kl_controller", STATE_FILE)
    if kl.get("class") != type(trainer.kl_ctl).__name__:
        raise ValueError(
            f"{directory / STATE_FILE}: kl_controller is a {kl.get('class')}, the trainer has a "
            f"{type(trainer.kl_ctl).__name__} (was adaptive_kl changed?)"
        )
    sampler = _require(state, "sampler", STATE_FILE)
    if sampler.get("n_prompts") != len(trainer.sampler.prompts):
        raise ValueError(
            f"{directory / STATE_FILE}: sampler.n_prompts is {sampler.get('n_prompts')}, the trainer has "
            f"{len(trainer.sampler.prompts)} prompts"
        )
    py_rng = _require(_require(state, "rng", STATE_FILE), "python", f"{STATE_FILE} rng")
    np_rng = _require(state["rng"], "numpy", f"{STATE_FILE} rng")

    # All validated: now mutate.
    trainer.m.policy.load_state_dict(policy_sd, strict=True)
    trainer.m.value.load_state_dict(value_sd, strict=True)
    trainer.optimizer.load_state_dict(opt_sd)
    trainer.kl_ctl.load_state_dict(kl["state"])
    trainer.sampler.rng.setstate(_python_rng_tuple(sampler["rng"]))
    trainer.sampler.order = [int(i) for i in sampler["order"]]
    trainer.sampler.pos = int(sampler["pos"])
    trainer.iteration = int(_require(state, "iteration", STATE_FILE))
    trainer.timings = {k: float(v) for k, v in state.get("timings", {}).items()}
    random.setstate(_python_rng_tuple(py_rng))
    np.random.set_state(_numpy_rng_tuple(np_rng))
    torch.set_rng_state(rng["torch_global"])
    trainer.generator.set_state(rng["generator"])
    _restore_cuda_rng(rng)
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
    """Save a module state dict to safetensors; a tensor that is exactly another one (a tied weight, e.g. GPT-2's
    lm_head and wte) is stored once and recorded as an alias; other storage sharing is broken by cloning."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    storages: set[int] = set()
    for name, t in state_dict.items():
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.numel() == 0:
            tensors[name] = t.clone().contiguous()
            continue
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        if ptr in storages or not t.is_contiguous():
            t = t.clone(memory_format=torch.contiguous_format)
        storages.add(ptr)
        tensors[name] = t
    save_file(tensors, str(path), metadata={_ALIASES_KEY: json.dumps(aliases)})


def _torch_rng_tensors(generator: torch.Generator) -> dict[str, Tensor]:
    """The torch RNG states: global CPU, the trainer's generator, and each CUDA device's when CUDA is in use."""
    tensors = {"torch_global": torch.get_rng_state(), "generator": generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    return tensors


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


def _require(obj: dict[str, Any], key: str, where: str) -> Any:
    """obj[key], or a ValueError naming the key and where it was expected."""
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"checkpoint {where}: missing key {key!r}")
    return obj[key]


def _load_module_state(module: torch.nn.Module, path: Path) -> dict[str, Tensor]:
    """Read a state dict saved by `_save_module_state` and check it against `module` (names, shapes, dtypes)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path))
        aliases = json.loads(metadata.get(_ALIASES_KEY, "{}"))
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"{path}: unreadable safetensors file ({e})") from e
    for alias, target in aliases.items():
        if target not in tensors:
            raise ValueError(f"{path}: tied weight {alias!r} points to missing tensor {target!r}")
        tensors[alias] = tensors[target]
    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: parameter names do not match the model: missing {missing}, unexpected {unexpected}")
    for name, t in tensors.items():
        want = expected[name]
        if t.shape != want.shape or t.dtype != want.dtype:
            raise ValueError(
                f"{path}: tensor {name!r} is {t.dtype} {tuple(t.shape)}, the model has {want.dtype} {tuple(want.shape)}"
            )
    return tensors


def _check_optimizer(optimizer: torch.optim.Optimizer, sd: dict[str, Any], path: Path) -> None:
    """Check a decoded optimizer state dict against `optimizer`: groups, parameter counts and moment shapes."""
    groups = optimizer.param_groups
    saved = sd["param_groups"]
    if len(saved) != len(groups):
        raise ValueError(f"{path}: {len(saved)} param groups saved, the optimizer has {len(groups)}")
    index: dict[int, Tensor] = {}  # saved parameter index -> the live parameter it will restore
    for i, (s, g) in enumerate(zip(saved, groups)):
        if len(s.get("params", [])) != len(g["params"]):
            raise ValueError(
                f"{path}: param group {i} has {len(s.get('params', []))} parameters saved, "
                f"the optimizer has {len(g['params'])}"
            )
        index.update(zip(s["params"], g["params"]))
    for pid, entry in sd["state"].items():
        if pid not in index:
            raise ValueError(f"{path}: optimizer state for unknown parameter index {pid}")
        for k, v in entry.items():
            if isinstance(v, Tensor) and v.dim() > 0 and v.shape != index[pid].shape:
                raise ValueError(
                    f"{path}: tensor 'state.{pid}.{k}' has shape {tuple(v.shape)}, "
                    f"its parameter has {tuple(index[pid].shape)}"
                )


def _restore_cuda_rng(rng: dict[str, Tensor]) -> None:
    """Restore CUDA RNG states saved alongside, when this process uses as many CUDA devices."""
    cuda = sorted((int(k.split(".")[1]), v) for k, v in rng.items() if k.startswith("cuda."))
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([v for _, v in cuda])


# ---------------------------------------------------------------------------------------------------------------
# optimizer state <-> JSON + tensors


def _encode_optimizer(sd: dict[str, Any], tensors: dict[str, Tensor]) -> dict[str, Any]:
    """JSON form of `optimizer.state_dict()`; its tensors go into `tensors` under `state.<idx>.<key>` and
    `param_groups.<i>.<key>`."""
    return {
        "state": {
            str(pid): {k: _encode(v, f"state.{pid}.{k}", tensors) for k, v in entry.items()}
            for pid, entry in sd["state"].items()
        },
        "param_groups": [
            {k: _encode(v, f"param_groups.{i}.{k}", tensors) for k, v in group.items()}
            for i, group in enumerate(sd["param_groups"])
        ],
    }


def _decode_optimizer(obj: dict[str, Any], tensors: dict[str, Tensor], directory: Path) -> dict[str, Any]:
    """Inverse of `_encode_optimizer`."""
    where = directory / OPTIMIZER_FILE
    state = _require(obj, "state", f"{STATE_FILE} optimizer")
    groups = _require(obj, "param_groups", f"{STATE_FILE} optimizer")
    return {
        "state": {int(pid): {k: _decode(v, tensors, where) for k, v in entry.items()} for pid, entry in state.items()},
        "param_groups": [{k: _decode(v, tensors, where) for k, v in g.items()} for g in groups],
    }


def _encode(value: Any, name: str, tensors: dict[str, Tensor]) -> Any:
    """JSON form of a value: tensors become {"__tensor__": name} (stored in `tensors`), tuples {"__tuple__": [...]}."""
    if isinstance(value, Tensor):
        tensors[name] = value.detach().cpu().contiguous()
        return {"__tensor__": name}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{name}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{name}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"optimizer state {name}: only str dict keys can be saved")
        return {k: _encode(v, f"{name}.{k}", tensors) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"optimizer state {name}: cannot save a {type(value).__name__} without pickle")


def _decode(value: Any, tensors: dict[str, Tensor], where: Path) -> Any:
    """Inverse of `_encode`."""
    if isinstance(value, dict):
        if set(value) == {"__tensor__"}:
            name = value["__tensor__"]
            if name not in tensors:
                raise ValueError(f"{where}: missing tensor {name!r}")
            return tensors[name]
        if set(value) == {"__tuple__"}:
            return tuple(_decode(v, tensors, where) for v in value["__tuple__"])
        return {k: _decode(v, tensors, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, tensors, where) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------------------
# python and numpy RNG states <-> JSON


def _python_rng_state(state: tuple[Any, ...]) -> dict[str, Any]:
    """JSON form of `random.getstate()`: (version, 625 ints of Mersenne-Twister state, gauss_next)."""
    version, internal, gauss_next = state
    return {"version": version, "internal": list(internal), "gauss_next": gauss_next}


def _python_rng_tuple(obj: dict[str, Any]) -> tuple[Any, ...]:
    """Inverse of `_python_rng_state`, for `random.setstate`."""
    return (obj["version"], tuple(int(x) for x in obj["internal"]), obj["gauss_next"])


def _numpy_rng_state() -> dict[str, Any]:
    """JSON form of the legacy numpy global RNG state (`np.random.get_state()`)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
        "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian),
    }


def _numpy_rng_tuple(obj: dict[str, Any]) -> tuple[Any, ...]:
    """Inverse of `_numpy_rng_state`, for `np.random.set_state`."""
    return (obj["name"], np.asarray(obj["keys"], dtype=np.uint32), int(obj["pos"]),
            int(obj["has_gauss"]), float(obj["cached_gaussian"]))
