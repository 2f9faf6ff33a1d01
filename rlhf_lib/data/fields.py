"""Row-level checks shared by the pipeline's own files and every user format: the `DataError` they raise, and typed
access to a row's fields through a column mapping (errors name the user's own column)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class DataError(ValueError):
    """A bad data file or row. `kind` is the short reason (the skip-count key), `field` the field involved; a bad
    row of a whole source also says how many of its `rows` are bad (`bad_rows`: what `on_bad_row=skip` would drop).

    The attributes are keyword-only, so the exception pickles (`cls(message)` plus its `__dict__`).
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.path, self.line, self.field, self.kind = path, line, field, kind
        self.bad_rows: int | None = None
        self.rows: int | None = None


def bad(kind: str, detail: str, field: str | None = None) -> DataError:
    """A bad row, before the reader adds the file name and line number."""
    return DataError(detail, field=field, kind=kind)


_JSON_TYPES = {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}


def jtype(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def check_text(value: str, field: str, label: str, allow_empty: bool = False) -> str:
    """`value` unchanged, or a bad row: empty/whitespace-only (unless allowed) or not encodable as UTF-8."""
    if not allow_empty and not value.strip():
        raise bad("empty text", f"{label}: empty or whitespace-only text", field)
    try:  # a JSON "\ud800" escape decodes to a lone surrogate, which cannot be written back as UTF-8
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("invalid text", f"{label}: text contains a lone surrogate", field) from None
    return value


class Fields:
    """A row seen through a column mapping: code asks for our names (`prompt`), errors name the user's columns.

    `mapping` maps our name -> the user's column; unmapped names are looked up as they are.
    """

    def __init__(self, row: Mapping[str, Any], mapping: Mapping[str, str] | None = None) -> None:
        self.row, self.mapping = row, dict(mapping or {})

    def col(self, name: str) -> str:
        """The user's column behind our `name`."""
        return self.mapping.get(name, name)

    def has(self, name: str) -> bool:
        return self.col(name) in self.row

    def get(self, name: str) -> Any:
        col = self.col(name)
        if col not in self.row:
            raise bad("missing field", f"missing field {col!r}", col)
        return self.row[col]

    def text(self, name: str, allow_empty: bool = False) -> str:
        value, col = self.get(name), self.col(name)
        if not isinstance(value, str):
            raise bad("wrong type", f"field {col!r}: expected a string, got {jtype(value)}", col)
        return check_text(value, col, f"field {col!r}", allow_empty)

    def texts(self, name: str) -> list[str]:
        """A list of at least two non-empty strings."""
        value, col = self.get(name), self.col(name)
        if not isinstance(value, list):
            raise bad("wrong type", f"field {col!r}: expected a list of strings, got {jtype(value)}", col)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise bad("wrong type", f"field {col!r}: expected a list of strings, item {i} is {jtype(item)}", col)
            check_text(item, col, f"field {col!r} item {i}")
        if len(value) < 2:
            raise bad("too few responses", f"field {col!r}: a ranked list needs >= 2 responses, got {len(value)}", col)
        return value

    def numbers(self, name: str, n: int) -> list[float]:
        """A list of `n` finite numbers (bools are not numbers here)."""
        value, col = self.get(name), self.col(name)
        ok = isinstance(value, list) and all(type(v) in (int, float) and math.isfinite(v) for v in value)
        if not ok:
            got = jtype(value) if not isinstance(value, list) else "a list with non-numbers"
            raise bad("wrong type", f"field {col!r}: expected a list of finite numbers, got {got}", col)
        if len(value) != n:
            raise bad("bad scores", f"field {col!r}: {len(value)} scores for {n} responses", col)
        return [float(v) for v in value]
