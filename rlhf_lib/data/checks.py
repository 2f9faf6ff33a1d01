"""Rows that parse but should not train silently: NUL bytes in a text, a preference row given twice, and two rows that
rank the same two responses both ways. `read_source` warns with their counts and first lines; with
`data.on_bad_row=skip` it drops them and counts them like the rows it skips."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .records import PairExample, RankedExample, SFTExample

REASONS = ("NUL byte", "duplicate", "contradicting")


class DataWarning(UserWarning):
    """Rows that are valid but suspicious (`rlhf_lib.data.checks`)."""


def _texts(record: Any) -> list[str]:
    if isinstance(record, RankedExample):
        return [record.prompt, *record.responses]
    if isinstance(record, PairExample):
        return [record.prompt, record.chosen, record.rejected]
    if isinstance(record, SFTExample):
        return [record.prompt, record.response]
    return [getattr(record, "prompt", "")]


def _ranking(record: Any) -> tuple[str, tuple[str, ...]] | None:
    if isinstance(record, RankedExample):
        return record.prompt, record.responses
    if isinstance(record, PairExample):
        return record.prompt, (record.chosen, record.rejected)
    return None


def suspicious_rows(kind: str, records: Sequence[Any]) -> dict[str, list[int]]:
    """Indices into `records` for each reason that applies (a row counts under its first reason): "NUL byte" (any
    text holds one), "duplicate" (the same preference or SFT row as an earlier one; prompts are de-duplicated
    anyway), "contradicting" (a preference row ranks a response pair the other way from another row's: every row
    involved). Example: rows (p, a > b), (p, a > b), (p, b > a) -> duplicate [1], contradicting [0, 2]."""
    out: dict[str, list[int]] = {reason: [] for reason in REASONS}
    seen: set[Any] = set()
    better: dict[tuple[str, str, str], list[int]] = {}
    for i, record in enumerate(records):
        if any("\x00" in t for t in _texts(record)):
            out["NUL byte"].append(i)
            continue
        if kind == "prompts":
            continue
        key = (type(record).__name__, *_texts(record))
        if key in seen:
            out["duplicate"].append(i)
            continue
        seen.add(key)
        if (ranked := _ranking(record)) is not None:
            prompt, responses = ranked
            for a in range(len(responses)):
                for b in range(a + 1, len(responses)):
                    better.setdefault((prompt, responses[a], responses[b]), []).append(i)
    contradicting: set[int] = set()
    for (prompt, a, b), rows in better.items():
        if (other := better.get((prompt, b, a))) and a != b:
            contradicting.update(rows)
            contradicting.update(other)
    out["contradicting"] = sorted(contradicting)
    return {reason: rows for reason, rows in out.items() if rows}
