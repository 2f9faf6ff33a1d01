"""The eval's SFT side, remembered on this machine (docs/architecture.md, "Caching inside the eval").

The eval samples the SFT model on the held-out prompts twice over: once beside the policy, and max(eval.best_of)
more times for best-of-n (768 replies for best-of-16 on 48 prompts). None of it depends on the PPO policy, so a sweep
of PPO settings against one SFT model and reward model would sample the same replies in every eval. Each such
`generate_and_score` result is kept under `<state>/eval-memo/`, keyed by what it depends on: the SFT and reward
models' digests, the eval config minus the keys that only choose what is compared (best_of, the report's rows), the
data, the eval code (`stages.cache.cache_key`), the device and dtypes, the seed and the prompts themselves. An entry
is written whole (a temporary file renamed into place) and read with `torch.load(weights_only=True)`; one that does
not load is sampled again and replaced. `--force eval` samples everything again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlhf_lib.eval import Generations
from stages.cache import StageResult, cache_key
from stages.home import state_dir

_log = logging.getLogger(__name__)
# Eval keys that choose what is compared or shown, never how the SFT model samples or is scored.
NOT_SAMPLING = ("best_of", "best_of_prompts", "samples_in_report", "constant_reply_prompts", "judge_pairs",
                "max_prompts", "controls")
# Parts of the eval stage's key that choose how samples are compared, never how the SFT side samples or is scored.
NOT_SAMPLING_SECTIONS = ("best_of_shaping",)


def memo_key(section: dict[str, Any], upstream: dict[str, StageResult], fingerprint: str, device: str,
             frozen_dtype: str) -> str:
    """The key every entry of one eval shares: the eval stage's key without the policy and the non-sampling keys."""
    part = {k: v for k, v in section.items() if k not in NOT_SAMPLING_SECTIONS} | {"eval": {k: v for k, v in section["eval"].items() if k not in NOT_SAMPLING},
                            "device": device, "frozen_dtype": frozen_dtype}
    models = {k: v.digest for k, v in upstream.items() if k in ("sft", "reward")}
    return cache_key("eval", part, models, fingerprint)


def _floats(name: str, value: Any, n: int) -> None:
    if not isinstance(value, torch.Tensor) or value.shape != (n,) or not value.is_floating_point():
        raise ValueError(f"{name}: expected a float tensor of shape ({n},)")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name}: not finite")


def _values(name: str, value: Any, n: int, kind: type) -> None:
    if not isinstance(value, list) or len(value) != n or not all(type(v) is kind or
                                                                  (kind is float and type(v) is int) for v in value):
        raise ValueError(f"{name}: expected a list of {n} {kind.__name__}s")
    if kind is float and not all(math.isfinite(v) for v in value):
        raise ValueError(f"{name}: not finite")


def checked(gens: Generations, n: int) -> Generations:
    """`gens` when every field is what `generate_and_score` writes for `n` prompts (types, shapes, finite numbers),
    else ValueError naming the field: an entry that loads but was not written by us (or for these prompts) never
    stands in for the SFT side."""
    _values("texts", gens.texts, n, str)
    for name in ("scores", "lengths", "kl_to_ref"):
        _floats(name, getattr(gens, name), n)
    if not isinstance(gens.has_eos, torch.Tensor) or gens.has_eos.shape != (n,) or gens.has_eos.dtype != torch.bool:
        raise ValueError(f"has_eos: expected a bool tensor of shape ({n},)")
    if gens.gold is not None:
        _values("gold", gens.gold, n, float)
    if not isinstance(gens.terms or {}, dict) or not isinstance(gens.parts, dict):
        raise ValueError("terms / parts: expected dicts")
    for name, values in (gens.terms or {}).items():
        _values(f"terms[{name!r}]", values, n, float)
    for name, values in gens.parts.items():
        _floats(f"parts[{name!r}]", values, n)
    if gens.turns is not None:
        _values("turns", gens.turns, n, str)
    return gens


def memo_dir() -> Path:
    return state_dir() / "eval-memo"


class SftMemo:
    """A `rlhf_lib.eval.SftMemo` over `memo_dir()`. `reused` and `sampled` count the entries read and computed."""

    def __init__(self, key: str, refresh: bool = False, root: Path | None = None):
        self.key, self.refresh, self.root = key, refresh, root or memo_dir()
        self.reused = self.sampled = 0

    def path(self, seed: int, prompts: Sequence[str]) -> Path:
        h = hashlib.sha256(json.dumps([self.key, seed, list(prompts)]).encode()).hexdigest()[:32]
        return self.root / f"{h}.pt"

    def __call__(self, seed: int, prompts: Sequence[str], compute: Callable[[], Generations]) -> Generations:
        path = self.path(seed, prompts)
        if not self.refresh and path.exists():
            try:
                got = checked(Generations(**torch.load(path, weights_only=True)), len(prompts))
                self.reused += 1
                return got
            except Exception as e:  # a damaged entry is sampled again, never trusted
                _log.warning("eval memo: %s does not load (%s: %s); sampling again", path, type(e).__name__, e)
        got = compute()
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".pt")
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(dataclasses.asdict(got), fh)
            os.replace(tmp, path)  # whole or absent
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.sampled += 1
        return got

    def describe(self) -> str:
        """The report's lineage line."""
        total = self.reused + self.sampled
        return f"{self.reused} of {total} sampled by an earlier eval of the same SFT model and RM on this machine"
