"""Typed records and the readers/validators of the pipeline's own JSONL files (the demo task writes them, and the
data stage writes user data into them after `formats` has parsed it).

Formats, one JSON object per line (blank lines ignored, extra fields ignored except in prompts):

- SFT: {"prompt": str, "response": str}   (the prompt may be empty: plain-text SFT)
- ranked lists: {"prompt": str, "responses": [str, ...], "ranking": [int, ...]}, ranking = indices, best first
- prompts: {"prompt": str, ...}, every other field a JSON scalar kept in `PromptExample.columns` (the arithmetic
  task's "answer", which a rule-based reward reads)
- pairs: {"prompt": str, "chosen": str, "rejected": str}

Ranked lists and pairs may carry an optional "category" (a string: the source's `category` column, RewardBench's
layout), which the reward-model report breaks its accuracy down by.

Every problem is a `DataError` whose message reads "<path>:<line>: <reason>" and names the field involved, so a user
can fix their file; with on_bad_row="skip" bad rows are dropped and counted by reason instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from .fields import DataError, Fields, bad, check_text, jtype
from .jsonl import jsonl_rows, write_jsonl  # noqa: F401  (re-exported: the demo builder imports it here)

T = TypeVar("T")
OnBadRow = Literal["error", "skip"]
ASSISTANT_TURN = "\n\nAssistant:"
MAX_EXAMPLES = 3  # error messages kept per skip reason, to show the user what was skipped


@dataclass(frozen=True)
class SFTExample:
    prompt: str
    response: str


@dataclass(frozen=True)
class RankedExample:
    prompt: str
    responses: tuple[str, ...]  # best first (the file's ranking already applied)
    category: str | None = None


@dataclass(frozen=True)
class PromptExample:
    prompt: str
    # The row's other fields (JSON scalars: str, finite number, bool, null), e.g. {"answer": "85"}. Not hashed, so
    # the record stays hashable; equal records still need equal columns.
    columns: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class PairExample:
    prompt: str
    chosen: str
    rejected: str
    category: str | None = None


Record = SFTExample | RankedExample | PromptExample | PairExample


def n_chars(record: Record) -> int:
    """Characters of text in a record (the overlong-row check): its strings, those in lists and column values."""
    total = 0
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            total += sum(len(v) for v in value.values() if isinstance(v, str))
        elif value is not None:
            total += sum(map(len, value))
    return total


@dataclass
class ReadResult(Generic[T]):
    """The valid rows of a source, how many rows were skipped for each reason, and the first messages of each."""

    rows: list[T]
    skipped: dict[str, int] = field(default_factory=dict)
    path: Path = Path()
    examples: dict[str, list[str]] = field(default_factory=dict)


def _parse_sft(obj: dict[str, Any]) -> SFTExample:
    f = Fields(obj)
    return SFTExample(f.text("prompt", allow_empty=True), f.text("response"))


def _parse_prompt(obj: dict[str, Any]) -> PromptExample:
    return PromptExample(Fields(obj).text("prompt"), _columns(obj))


def _columns(obj: dict[str, Any]) -> dict[str, Any]:
    """Every field but "prompt", each a JSON scalar; a list or object, or what JSON cannot write back (NaN, inf, a
    lone surrogate), is a bad row naming the field."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "prompt":
            continue
        if isinstance(value, (list, dict)):
            raise bad("wrong type", f"field {key!r}: expected a string, number, bool or null, got {jtype(value)}", key)
        if isinstance(value, float) and not math.isfinite(value):
            raise bad("wrong type", f"field {key!r}: expected a finite number, got {value}", key)
        out[key] = check_text(value, key, f"field {key!r}", allow_empty=True) if isinstance(value, str) else value
    return out


def check_pair(chosen: str, rejected: str, cols: tuple[str, str] = ("chosen", "rejected")) -> None:
    if chosen.strip() == rejected.strip():
        raise bad("chosen equals rejected", f"fields {cols[0]!r} and {cols[1]!r}: identical texts carry no "
                  "preference", cols[1])


def _parse_pair(obj: dict[str, Any]) -> PairExample:
    f = Fields(obj)
    ex = PairExample(f.text("prompt"), f.text("chosen"), f.text("rejected"), category(f))
    check_pair(ex.chosen, ex.rejected)
    return ex


def category(f: Fields) -> str | None:
    """The row's optional `category`: a non-empty string or number, as a string; None when absent or empty."""
    value = f.get("category") if f.has("category") else None
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        col = f.col("category")
        raise bad("wrong type", f"field {col!r}: expected a string, got {jtype(value)}", col)
    return str(value).strip()


def check_no_ties(responses: list[str], col: str = "responses") -> None:
    if len({r.strip() for r in responses}) < len(responses):
        raise bad("duplicate responses", f"field {col!r}: duplicate responses (a tie cannot be ranked)", col)


def _parse_ranked(obj: dict[str, Any]) -> RankedExample:
    f = Fields(obj)
    prompt, responses = f.text("prompt"), f.texts("responses")
    check_no_ties(responses)
    return RankedExample(prompt, ranked(f, responses), category(f))


def ranked(f: Fields, responses: list[str]) -> tuple[str, ...]:
    """`responses` best first, by the row's `ranking` (a permutation of their indices, best first)."""
    ranking, col = f.get("ranking"), f.col("ranking")
    if not isinstance(ranking, list) or not all(type(i) is int for i in ranking):  # bool is not a rank
        got = "a list with non-integers" if isinstance(ranking, list) else jtype(ranking)
        raise bad("wrong type", f"field {col!r}: expected a list of integers, got {got}", col)
    if sorted(ranking) != list(range(len(responses))):
        shown = str(ranking) if len(ranking) <= 20 else str(ranking[:20])[:-1] + ", ...]"
        raise bad("bad ranking", f"field {col!r}: expected a permutation of 0..{len(responses) - 1}, got {shown}", col)
    return tuple(responses[i] for i in ranking)


def collect(rows: Iterable[tuple[int, dict[str, Any] | DataError]], parse: Callable[[dict[str, Any]], T],
            on_bad_row: OnBadRow, max_chars: int, where: str, place: Callable[[int], str] | None = None,
            max_rows: int | None = None, skip_rows: int = 0) -> ReadResult[T]:
    """Parse numbered rows into records; a bad row raises (naming `where`, its place and field) or is counted.

    `rows` yields (number, object), or (number, DataError) for a row that could not even be decoded. `place` says
    where a row is: `path:<line>` by default, e.g. `path: row <n>` for sources that have rows but not lines.
    `max_rows`: stop after that many valid rows (the rest is neither read nor checked). `skip_rows`: leave out the
    first that many valid rows (still checked), so `max_rows` counts the rows after them.
    """
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    place = place or (lambda n: f"{where}:{n}")
    out: list[T] = []
    skipped: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    first: DataError | None = None
    passed = 0  # valid rows before the ones kept (skip_rows)
    for n, obj in rows:
        try:
            if isinstance(obj, DataError):
                raise obj
            row = parse(obj)
            if (size := n_chars(row)) > max_chars:  # type: ignore[arg-type]
                raise bad("too long", f"row too long: {size} characters of text, more than max_chars={max_chars}")
            if passed < skip_rows:
                passed += 1
                continue
            out.append(row)
            if max_rows is not None and len(out) >= max_rows:
                break
        except DataError as e:
            message = f"{place(n)}: {e}"
            # With on_bad_row="error" the first bad row fails the read, once every row is checked: the error says
            # how many rows skipping would drop.
            first = first or DataError(message, path=where, line=n, field=e.field, kind=e.kind)
            kind = e.kind or "bad row"
            skipped[kind] = skipped.get(kind, 0) + 1
            if len(examples.setdefault(kind, [])) < MAX_EXAMPLES:
                examples[kind].append(message)
    if first is not None and on_bad_row == "error":
        first.bad_rows, first.rows = sum(skipped.values()), sum(skipped.values()) + len(out)
        raise first
    if not out:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())) or "the file is empty"
        raise DataError(f"{where}: no valid rows ({why})", path=where, kind="no rows")
    return ReadResult(rows=out, skipped=skipped, path=Path(where), examples=examples)


def _read(path: str | Path, parse: Callable[[dict[str, Any]], T], on_bad_row: OnBadRow, max_chars: int
          ) -> ReadResult[T]:
    return collect(jsonl_rows(path), parse, on_bad_row, max_chars, str(path))


def read_sft(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[SFTExample]:
    """Read SFT demonstrations {"prompt", "response"}."""
    return _read(path, _parse_sft, on_bad_row, max_chars)


def read_ranked(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[RankedExample]:
    """Read ranked lists {"prompt", "responses", "ranking"}; each example's responses come out best first."""
    return _read(path, _parse_ranked, on_bad_row, max_chars)


def read_prompts(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[PromptExample]:
    """Read prompts {"prompt", ...}; the row's other fields (JSON scalars) come out as `columns`."""
    return _read(path, _parse_prompt, on_bad_row, max_chars)


def read_pairs(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[PairExample]:
    """Read preference pairs {"prompt", "chosen", "rejected"}."""
    return _read(path, _parse_pair, on_bad_row, max_chars)
