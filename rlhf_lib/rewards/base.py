"""What every reward source reads and returns: a batch of decoded (prompt, completion) texts with the prompts' extra
columns, and one finite float per row, checked here whatever the source.

A text source (a Python function, an HTTP endpoint) is called as `source(batch) -> list[float]`. The HTTP protocol
(`rlhf_lib.rewards.http`, `rlhf serve-reward`) sends `TextBatch.to_json()` and reads `{"scores": [...]}`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class RewardError(ValueError):
    """A reward source failed or returned something unusable. The message names the source (and its URL or
    function) and, for a bad value, the row."""


@dataclass
class TextBatch:
    """B rows: `prompts` and `completions` as text (the completion without its EOS token), `finished[i]` whether
    completion i ended with EOS (false: cut off at max_new_tokens), and `columns`: the prompts' extra fields (for
    example `answer`), one list of B values per column name."""

    prompts: list[str]
    completions: list[str]
    finished: list[bool]
    columns: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        lengths = {"completions": len(self.completions), "finished": len(self.finished)}
        lengths |= {f"columns[{k!r}]": len(v) for k, v in self.columns.items()}
        if bad := {k: m for k, m in lengths.items() if m != n}:
            raise ValueError(f"TextBatch: {n} prompts but {bad}")

    def __len__(self) -> int:
        return len(self.prompts)

    def to_json(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "completions": self.completions, "finished": self.finished,
                "columns": self.columns}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TextBatch:
        """The request body of the HTTP protocol; a missing or mistyped field raises `ValueError` naming it."""
        if not isinstance(obj, dict):
            raise ValueError("the request body must be a JSON object")
        for key in ("prompts", "completions"):
            if not isinstance(obj.get(key), list) or not all(isinstance(t, str) for t in obj[key]):
                raise ValueError(f"field {key!r} must be a list of strings")
        finished = obj.get("finished", [True] * len(obj["prompts"]))
        if not isinstance(finished, list) or not all(isinstance(f, bool) for f in finished):
            raise ValueError("field 'finished' must be a list of booleans")
        columns = obj.get("columns") or {}
        if not isinstance(columns, dict) or not all(isinstance(v, list) for v in columns.values()):
            raise ValueError("field 'columns' must be an object of lists")
        return cls(obj["prompts"], obj["completions"], finished, columns)


class TextReward(Protocol):
    """A reward source over text: one float per row of the batch."""

    def __call__(self, batch: TextBatch) -> Sequence[float]: ...


def check_scores(values: Any, n: int, source: str) -> list[float]:
    """`values` as n finite floats, or a `RewardError` naming `source` (e.g. "reward 'length' (function
    mypkg.rewards:length)") and the first bad row."""
    try:
        values = list(values)
    except TypeError:
        raise RewardError(f"{source}: returned {type(values).__name__}, expected a list of {n} floats") from None
    if len(values) != n:
        raise RewardError(f"{source}: returned {len(values)} scores for a batch of {n} rows")
    out = []
    for i, v in enumerate(values):
        try:  # a bool counts as 0/1; a numpy or torch scalar as its value
            f = float(v)
        except (TypeError, ValueError):
            raise RewardError(f"{source}: row {i}: score {v!r} is not a number") from None
        if not math.isfinite(f):
            raise RewardError(f"{source}: row {i}: score {f} is not finite")
        out.append(f)
    return out
