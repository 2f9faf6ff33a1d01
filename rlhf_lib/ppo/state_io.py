"""Low-level pieces of `rlhf_lib.ppo.checkpoint`: turning training state into safetensors tensors and JSON and
back, without pickle, and checking what was read against the live objects before anything is restored.

    module state   state dict <-> safetensors tensors (tied weights stored once; aliases in the file's metadata)
    optimizer      `optimizer.state_dict()` <-> JSON + tensors named `state.<idx>.<key>`, `param_groups.<i>.<key>`
    RNG states     torch (global, generator, CUDA) as tensors; python's `random` and numpy's legacy RNG as JSON
    validation     `require` for a missing key, checks of a module state dict and an optimizer state dict

Nothing here writes a file: the caller (`checkpoint.save_checkpoint`) does all the writing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor

ALIASES_KEY = "aliases"  # safetensors metadata key: JSON {alias name: stored name} of tied weights


# ---------------------------------------------------------------------------------------------------------------
# writing


def module_state_tensors(state_dict: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors and metadata to save a module state dict to safetensors; a tensor that is exactly another one
    (a tied weight, e.g. GPT-2's lm_head and wte) is stored once and recorded as an alias; other storage sharing is
    broken by cloning."""
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
    return tensors, {ALIASES_KEY: json.dumps(aliases)}


def torch_rng_tensors(generator: torch.Generator) -> dict[str, Tensor]:
    """The torch RNG states: global CPU, the trainer's generator, and each CUDA device's when CUDA is in use."""
    tensors = {"torch_global": torch.get_rng_state(), "generator": generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    return tensors


# ---------------------------------------------------------------------------------------------------------------
# reading


def require(obj: dict[str, Any], key: str, where: str) -> Any:
    """obj[key], or a ValueError naming the key and where it was expected."""
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"checkpoint {where}: missing key {key!r}")
    return obj[key]


def load_module_state(module: torch.nn.Module, path: Path) -> dict[str, Tensor]:
    """Read a state dict saved from `module_state_tensors` and check it against `module` (names, shapes, dtypes)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path))
        aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
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


def check_optimizer(optimizer: torch.optim.Optimizer, sd: dict[str, Any], path: Path) -> None:
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


def restore_cuda_rng(rng: dict[str, Tensor]) -> None:
    """Restore CUDA RNG states saved alongside, when this process uses as many CUDA devices."""
    cuda = sorted((int(k.split(".")[1]), v) for k, v in rng.items() if k.startswith("cuda."))
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([v for _, v in cuda])


# ---------------------------------------------------------------------------------------------------------------
# optimizer state <-> JSON + tensors


def encode_optimizer(sd: dict[str, Any], tensors: dict[str, Tensor]) -> dict[str, Any]:
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


def decode_optimizer(obj: dict[str, Any], tensors: dict[str, Tensor], where: Path, obj_where: str) -> dict[str, Any]:
    """Inverse of `encode_optimizer`. `where` is the tensors' file, `obj_where` names where `obj` was read (both
    for error messages)."""
    state = require(obj, "state", obj_where)
    groups = require(obj, "param_groups", obj_where)
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


def python_rng_state(state: tuple[Any, ...]) -> dict[str, Any]:
    """JSON form of `random.getstate()`: (version, 625 ints of Mersenne-Twister state, gauss_next)."""
    version, internal, gauss_next = state
    return {"version": version, "internal": list(internal), "gauss_next": gauss_next}


def python_rng_tuple(obj: dict[str, Any]) -> tuple[Any, ...]:
    """Inverse of `python_rng_state`, for `random.setstate`."""
    return (obj["version"], tuple(int(x) for x in obj["internal"]), obj["gauss_next"])


def numpy_rng_state() -> dict[str, Any]:
    """JSON form of the legacy numpy global RNG state (`np.random.get_state()`)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
        "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian),
    }


def numpy_rng_tuple(obj: dict[str, Any]) -> tuple[Any, ...]:
    """Inverse of `numpy_rng_state`, for `np.random.set_state`."""
    return (obj["name"], np.asarray(obj["keys"], dtype=np.uint32), int(obj["pos"]),
            int(obj["has_gauss"]), float(obj["cached_gaussian"]))
