"""Typed readers and validators of the pipeline's JSONL files (demo task and user data alike).

Formats, one JSON object per line (blank lines ignored, extra fields ignored):

- SFT: {"prompt": str, "response": str}
- ranked lists: {"prompt": str, "responses": [str, ...], "ranking": [int, ...]}, ranking = indices, best first
- prompts: {"prompt": str}
- pairs: {"prompt": str, "chosen": str, "rejected": str}

A prompt is an HH transcript: it must contain "\\n\\nAssistant:". Every problem is a `DataError` whose message reads
"<path>:<line>: <reason>" and names the field involved, so a user can fix their file; with on_bad_row="skip" bad rows
are dropped and counted by reason instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

T = TypeVar("T")
OnBadRow = Literal["error", "skip"]
ASSISTANT_TURN = "\n\nAssistant:"


@dataclass(frozen=True)
class SFTExample:
    prompt: str
    response: str


@dataclass(frozen=True)
class RankedExample:
    prompt: str
    responses: tuple[str, ...]  # best first (the file's ranking already applied)


@dataclass(frozen=True)
class PromptExample:
    prompt: str


@dataclass(frozen=True)
class PairExample:
    prompt: str
    chosen: str
    rejected: str


Record = SFTExample | RankedExample | PromptExample | PairExample


def as_row(record: Record) -> dict[str, Any]:
    """The JSONL row of a record (a ranked example is written best first with the identity ranking)."""
    row = {f.name: getattr(record, f.name) for f in fields(record)}
    if isinstance(record, RankedExample):
        row.update(responses=list(record.responses), ranking=list(range(len(record.responses))))
    return row


def _n_chars(record: Record) -> int:
    values = (getattr(record, f.name) for f in fields(record))
    return sum(len(v) if isinstance(v, str) else sum(map(len, v)) for v in values)


@dataclass
class ReadResult(Generic[T]):
    """The valid rows of a file, and how many rows were skipped for each reason."""

    rows: list[T]
    skipped: dict[str, int] = field(default_factory=dict)
    path: Path = Path()


class DataError(ValueError):
    """A bad data file or row. `kind` is the short reason (the skip-count key), `field` the field involved.

    The attributes are keyword-only, so the exception pickles (`cls(message)` plus its `__dict__`).
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.path, self.line, self.field, self.kind = path, line, field, kind


def _bad(kind: str, detail: str, field: str | None = None) -> DataError:
    """A bad row, before the reader adds the file name and line number."""
    return DataError(detail, field=field, kind=kind)


_JSON_TYPES = {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}


def _jtype(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def _check_text(value: str, field: str, label: str) -> str:
    if not value.strip():
        raise _bad("empty text", f"{label}: empty or whitespace-only text", field)
    try:  # a JSON "\ud800" escape decodes to a lone surrogate, which cannot be written back as UTF-8
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("invalid text", f"{label}: text contains a lone surrogate", field) from None
    return value


def _get(obj: dict[str, Any], name: str) -> Any:
    if name not in obj:
        raise _bad("missing field", f"missing field {name!r}", name)
    return obj[name]


def _text(obj: dict[str, Any], name: str) -> str:
    value = _get(obj, name)
    if not isinstance(value, str):
        raise _bad("wrong type", f"field {name!r}: expected a string, got {_jtype(value)}", name)
    return _check_text(value, name, f"field {name!r}")


def _prompt(obj: dict[str, Any]) -> str:
    prompt = _text(obj, "prompt")
    if ASSISTANT_TURN not in prompt:
        raise _bad("no assistant turn", "field 'prompt': no '\\n\\nAssistant:' turn (HH transcript format)", "prompt")
    return prompt


def _parse_sft(obj: dict[str, Any]) -> SFTExample:
    return SFTExample(_prompt(obj), _text(obj, "response"))


def _parse_prompt(obj: dict[str, Any]) -> PromptExample:
    return PromptExample(_prompt(obj))


def _parse_pair(obj: dict[str, Any]) -> PairExample:
    ex = PairExample(_prompt(obj), _text(obj, "chosen"), _text(obj, "rejected"))
    if ex.chosen.strip() == ex.rejected.strip():
        raise _bad("chosen equals rejected", "fields 'chosen' and 'rejected': identical texts carry no preference",
                   "rejected")
    return ex


def _parse_ranked(obj: dict[str, Any]) -> RankedExample:
    prompt = _prompt(obj)
    responses, f = _get(obj, "responses"), "field 'responses'"
    if not isinstance(responses, list):
        raise _bad("wrong type", f"{f}: expected a list of strings, got {_jtype(responses)}", "responses")
    for i, r in enumerate(responses):
        if not isinstance(r, str):
            raise _bad("wrong type", f"{f}: expected a list of strings, item {i} is {_jtype(r)}", "responses")
        _check_text(r, "responses", f"{f} item {i}")
    if len(responses) < 2:
        raise _bad("too few responses", f"{f}: a ranked list needs >= 2 responses, got {len(responses)}", "responses")
    if len({r.strip() for r in responses}) < len(responses):
        raise _bad("duplicate responses", f"{f}: duplicate responses (a tie cannot be ranked)", "responses")
    ranking, f = _get(obj, "ranking"), "field 'ranking'"
    if not isinstance(ranking, list) or not all(type(i) is int for i in ranking):  # bool is not a rank
        got = _jtype(ranking) if not isinstance(ranking, list) else "a list with non-integers"
        raise _bad("wrong type", f"{f}: expected a list of integers, got {got}", "ranking")
    if sorted(ranking) != list(range(len(responses))):
        shown = str(ranking) if len(ranking) <= 20 else str(ranking[:20])[:-1] + ", ...]"
        raise _bad("bad ranking", f"{f}: expected a permutation of 0..{len(responses) - 1}, got {shown}", "ranking")
    return RankedExample(prompt, tuple(responses[i] for i in ranking))


def _decode(raw: bytes, lineno: int) -> dict[str, Any] | None:
    """One line's JSON object, or None for a blank line."""
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # tolerate a UTF-8 byte-order mark
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad("invalid utf-8", f"invalid UTF-8 at byte {e.start}") from None
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: deeply nested brackets
        raise _bad("invalid json", f"invalid JSON ({str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise _bad("not an object", f"expected a JSON object, got {_jtype(obj)}")
    return obj


def _read(path: str | Path, parse: Callable[[dict[str, Any]], T], on_bad_row: OnBadRow,
          max_chars: int) -> ReadResult[T]:
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    where = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(f"{where}: file not found", path=where, kind="missing file") from None
    except OSError as e:
        raise DataError(f"{where}: cannot read file ({e.strerror or e})", path=where, kind="unreadable") from None
    rows: list[T] = []
    skipped: dict[str, int] = {}
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        try:
            obj = _decode(raw.removesuffix(b"\r"), lineno)
            if obj is not None:
                row = parse(obj)
                if (n := _n_chars(row)) > max_chars:  # type: ignore[arg-type]
                    raise _bad("too long", f"row too long: {n} characters of text, more than max_chars={max_chars}")
                rows.append(row)
        except DataError as bad:
            if on_bad_row == "error":
                raise DataError(f"{where}:{lineno}: {bad}", path=where, line=lineno, field=bad.field,
                                kind=bad.kind) from None
            kind = bad.kind or "bad row"
            skipped[kind] = skipped.get(kind, 0) + 1
    if not rows:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())) or "the file is empty"
        raise DataError(f"{where}: no valid rows ({why})", path=where, kind="no rows")
    return ReadResult(rows=rows, skipped=skipped, path=Path(path))


def read_sft(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[SFTExample]:
    """Read SFT demonstrations {"prompt", "response"}."""
    return _read(path, _parse_sft, on_bad_row, max_chars)


def read_ranked(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[RankedExample]:
    """Read ranked lists {"prompt", "responses", "ranking"}; each example's responses come out best first."""
    return _read(path, _parse_ranked, on_bad_row, max_chars)


def read_prompts(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[PromptExample]:
    """Read prompts {"prompt"}."""
    return _read(path, _parse_prompt, on_bad_row, max_chars)


def read_pairs(path: str | Path, on_bad_row: OnBadRow = "error", max_chars: int = 20000) -> ReadResult[PairExample]:
    """Read preference pairs {"prompt", "chosen", "rejected"}."""
    return _read(path, _parse_pair, on_bad_row, max_chars)


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any] | Record]) -> Path:
    """Write one JSON object per line, atomically (temp file + os.replace). Rows: mappings or records (`as_row`)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                obj = as_row(row) if is_dataclass(row) else dict(row)
                f.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; data files are meant to be shared
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def file_fingerprint(path: str | Path) -> str:
    """SHA-256 hex digest of the file's bytes (identifies a data version in run metadata)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        raise DataError(f"{path}: cannot read file ({e.strerror or e})", path=str(path)) from None
    return h.hexdigest()
