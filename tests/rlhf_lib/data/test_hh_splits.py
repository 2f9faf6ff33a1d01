"""The shipped HH harmless splits (data/hh-harmless/): every row sits in the file its documented rule names, no
opening request is in two files, and the counts are those docs/data.md gives."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).parents[3] / "data" / "hh-harmless"


def _split_module():
    spec = importlib.util.spec_from_file_location("hh_split", ROOT / "split.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_row_is_where_the_rule_puts_it_and_no_conversation_crosses_files():
    split = _split_module()
    openings: dict[str, set[str]] = {}
    counts = {}
    for name in split.SPLITS:
        rows = [json.loads(line) for line in (ROOT / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
        counts[name] = len(rows)
        assert all(split.split_of(r) == name for r in rows)
        openings[name] = {split.first_human_turn(r["chosen"]) for r in rows}
    assert counts == {"train": 1278, "validation": 183, "test": 339}
    assert not openings["train"] & openings["test"] and not openings["train"] & openings["validation"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
