"""Built-in reward functions, named in `ppo.rewards` as `rlhf_lib.rewards.builtin:<name>`.

Each takes the batch's prompts and completions (decoded, without EOS), `finished` (whether each completion ended with
EOS), the prompts' extra columns as keyword lists (TRL's `reward_funcs` convention), and its own parameters from
the source's `params`; it returns one float per row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_INTEGER = re.compile(r"-?\d+")


def first_integer(text: str) -> int | None:
    """The first integer written in `text` (an optional minus sign, then digits), or None."""
    m = _INTEGER.search(text)
    return int(m.group()) if m else None


def last_integer(text: str) -> int | None:
    """The last integer written in `text`, or None."""
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


def exact_match(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[Any] | None = None,
                read: str = "first", **_: Any) -> list[float]:
    """1.0 where the completion's first integer (`read: last`: its last) equals the row's `answer` column (compared
    as integers), else 0.0. A completion without a number scores 0. The arithmetic task's verifier (data.task:
    arithmetic); a chat model that writes "47 + 6 = 53" is read with `params: {read: last}`."""
    if answer is None:
        raise ValueError("exact_match needs an 'answer' column on the prompts (data.task: arithmetic writes one)")
    if read not in ("first", "last"):
        raise ValueError(f"exact_match: params.read is {read!r}; expected first or last")
    pick = first_integer if read == "first" else last_integer
    out = []
    for completion, want in zip(completions, answer):
        got = pick(completion)
        out.append(float(got is not None and got == int(str(want).strip())))
    return out


def length_target(prompts: Sequence[str], completions: Sequence[str], target: float = 20.0, scale: float | None = None,
                  **_: Any) -> list[float]:
    """-|words - target| / scale per row: 0 at `target` words, falling linearly away from it. `scale` (default
    `target`) sets how fast, so the score is -1 at no words. Words are whitespace-separated."""
    if target <= 0:
        raise ValueError(f"length_target: target must be > 0, got {target}")
    scale = float(scale or target)
    return [-abs(len(c.split()) - target) / scale for c in completions]


def required_format(prompts: Sequence[str], completions: Sequence[str], pattern: str = r"^.+[.!?]$",
                    finished: Sequence[bool] | None = None, require_eos: bool = True, **_: Any) -> list[float]:
    """1.0 where the stripped completion matches the regular expression `pattern` (`re.fullmatch`, DOTALL) and, with
    `require_eos`, the completion ended with EOS; else 0.0."""
    rx = re.compile(pattern, re.DOTALL)
    done = finished if finished is not None else [True] * len(completions)
    return [float(bool(rx.fullmatch(c.strip())) and (ok or not require_eos)) for c, ok in zip(completions, done)]
