"""Data contract of the pipeline: typed JSONL readers/validators and an atomic writer (see records.py)."""

from __future__ import annotations

from .records import (
    ASSISTANT_TURN,
    DataError,
    PairExample,
    PromptExample,
    RankedExample,
    ReadResult,
    SFTExample,
    as_row,
    file_fingerprint,
    read_pairs,
    read_prompts,
    read_ranked,
    read_sft,
    write_jsonl,
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
