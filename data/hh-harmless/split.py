"""Split the shipped HH-RLHF harmless sample into train / validation / test files (docs/data.md, "HH harmless").

The rule: a row goes by the sha256 of its first human turn (the conversation's opening request, so rows that open
the same conversation land in the same file), read as a number modulo 10: 0-6 train, 7 validation, 8-9 test. Rows
keep their order. Run from the project root: `python data/hh-harmless/split.py SOURCE.jsonl` rewrites the three
files next to this script; `tests/rlhf_lib/data/test_hh_splits.py` checks every shipped row is where the rule puts it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
SPLITS = ("train", "validation", "test")


def first_human_turn(transcript: str) -> str:
    body = transcript.split("\n\nHuman:", 1)[1]
    return body.split("\n\nAssistant:", 1)[0].strip()


def split_of(row: dict) -> str:
    bucket = int(hashlib.sha256(first_human_turn(row["chosen"]).encode()).hexdigest(), 16) % 10
    return "train" if bucket <= 6 else "validation" if bucket == 7 else "test"


def main(source: str) -> None:
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for line in lines:
        out[split_of(json.loads(line))].append(line)
    for name, rows in out.items():
        (HERE / f"{name}.jsonl").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
        print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    main(sys.argv[1])
