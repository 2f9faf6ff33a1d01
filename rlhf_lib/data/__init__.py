"""Data of the pipeline: the JSONL contract of its own files (records.py), user formats read through `datasets`
(sources.py, formats.py, hh.py, chat.py, user.py), and collation into token batches (collate.py)."""

from __future__ import annotations

from .fields import DataError
from .jsonl import as_row, file_fingerprint, write_jsonl
from .records import (
    ASSISTANT_TURN,
    PairExample,
    PromptExample,
    RankedExample,
    ReadResult,
    SFTExample,
    read_pairs,
    read_prompts,
    read_ranked,
    read_sft,
)

__all__ = [
    "ASSISTANT_TURN",
    "DataError",
    "PairExample",
    "PromptExample",
    "RankedExample",
    "ReadResult",
    "SFTExample",
    "as_row",
    "file_fingerprint",
    "read_pairs",
    "read_prompts",
    "read_ranked",
    "read_sft",
    "write_jsonl",
]
