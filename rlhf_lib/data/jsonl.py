"""JSON Lines, byte by byte: decoding one line at a time (so a bad line is named by its number), the atomic
writer of the pipeline's files, and content fingerprints."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from .fields import DataError, bad, jtype


def decode_line(raw: bytes, lineno: int) -> dict[str, Any] | None:
    """One line's JSON object, or None for a blank line; a bad line raises a `DataError` without place."""
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # tolerate a UTF-8 byte-order mark
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad("invalid utf-8", f"invalid UTF-8 at byte {e.start}") from None
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: deeply nested brackets
        raise bad("invalid json", f"invalid JSON ({str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise bad("not an object", f"expected a JSON object, got {jtype(obj)}")
    return obj


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes, or a `DataError` naming it."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found", path=str(path), kind="missing file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read file ({e.strerror or e})", path=str(path), kind="unreadable") from None


def jsonl_rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """(line number, object) for each non-blank line; a bad line yields its `DataError` instead of an object."""
    for lineno, raw in enumerate(read_bytes(path).split(b"\n"), start=1):
        try:
            obj = decode_line(raw.removesuffix(b"\r"), lineno)
        except DataError as e:
            yield lineno, e
            continue
        if obj is not None:
            yield lineno, obj


def as_row(record: Any) -> dict[str, Any]:
    """The JSONL row of a record dataclass (a ranked example is written best first with the identity ranking)."""
    row = {f.name: getattr(record, f.name) for f in fields(record)}
    if row.get("category", "") is None:  # an optional field is written only when set
        del row["category"]
    if isinstance(row.get("columns"), dict):  # a prompt's extra fields are top-level fields of its row
        row.update(row.pop("columns"))
    if isinstance(row.get("responses"), tuple):
        row.update(responses=list(row["responses"]), ranking=list(range(len(row["responses"]))))
    return row


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any] | Any]) -> Path:
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

