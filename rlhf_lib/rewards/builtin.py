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
MAX_ANSWER_DIGITS = 64  # a digit run longer than this is no answer (and never reaches int(): Python caps it at 4,300)


def read_integer(text: str) -> int | None:
    """`text` as an integer when it is one (an optional minus sign, then at most MAX_ANSWER_DIGITS digits), else
    None."""
    return int(text) if re.fullmatch(r"-?\d{1,%d}" % MAX_ANSWER_DIGITS, text) else None


def first_integer(text: str) -> int | None:
    """The first integer written in `text` (an optional minus sign, then digits), or None; a digit run longer than
    MAX_ANSWER_DIGITS reads as None (no answer)."""
    m = _INTEGER.search(text)
    return read_integer(m.group()) if m else None


def last_integer(text: str) -> int | None:
    """The last integer written in `text`, or None (also when that digit run is longer than MAX_ANSWER_DIGITS)."""
    found = _INTEGER.findall(text)
    return read_integer(found[-1]) if found else None


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
        got, expected = pick(completion), read_integer(str(want).strip())
        if expected is None:
            raise ValueError(f"exact_match: the answer column holds {str(want)[:40]!r}, not an integer")
        out.append(float(got is not None and got == expected))
    return out


def length_target(prompts: Sequence[str], completions: Sequence[str], target: float = 20.0, scale: float | None = None,
                  **_: Any) -> list[float]:
    """-|words - target| / scale per row: 0 at `target` words, falling linearly away from it. `scale` (default
    `target`) sets how fast, so the score is -1 at no words. Words are whitespace-separated."""
    if target <= 0:
        raise ValueError(f"length_target: target must be > 0, got {target}")
    scale = float(scale or target)
    return [-abs(len(c.split()) - target) / scale for c in completions]


MAX_PATTERN_CHARS = 1000
MATCH_TIMEOUT_S = 1.0  # per completion: a pattern from a parameter must not hang the worker (catastrophic backtracking)


def required_format(prompts: Sequence[str], completions: Sequence[str], pattern: str = r"^.+[.!?]$",
                    finished: Sequence[bool] | None = None, require_eos: bool = True, **_: Any) -> list[float]:
    """1.0 where the stripped completion matches the regular expression `pattern` (a full match, DOTALL) and, with
    `require_eos`, the completion ended with EOS; else 0.0. The pattern comes from a parameter, so it is bounded: at
    most MAX_PATTERN_CHARS characters, and each match is given MATCH_TIMEOUT_S seconds (the `regex` package's
    timeout, which interrupts the matcher itself); a pattern that does not compile or runs out of time raises
    ValueError naming it, and the iteration fails with that one line."""
    import regex

    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"required_format: the pattern has {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
    try:
        rx = regex.compile(pattern, regex.DOTALL)
    except regex.error as e:
        raise ValueError(f"required_format: the pattern {pattern[:80]!r} does not compile: {e}") from None
    done = finished if finished is not None else [True] * len(completions)
    out = []
    for c, ok in zip(completions, done):
        try:
            hit = rx.fullmatch(c.strip(), timeout=MATCH_TIMEOUT_S)
        except TimeoutError:
            raise ValueError(f"required_format: the pattern {pattern[:80]!r} took over {MATCH_TIMEOUT_S:g} s on a "
                             f"{len(c)}-character reply (catastrophic backtracking?)") from None
        out.append(float(bool(hit) and (ok or not require_eos)))
    return out
