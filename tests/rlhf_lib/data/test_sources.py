"""Sources: .jsonl line by line; .json/.csv/.parquet, directories and hub names through `datasets`."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rlhf_lib.data import DataError, RankedExample
from rlhf_lib.data.chat import Renderer
from rlhf_lib.data.sources import Source, source_rows
from rlhf_lib.data.user import read_source

P = "\n\nHuman: hi\n\nAssistant:"
ROWS = [{"prompt": "Q1", "chosen": "a", "rejected": "b"}, {"prompt": "Q2", "chosen": "c", "rejected": "d"}]
EXPECTED = [RankedExample("Q1", ("a", "b")), RankedExample("Q2", ("c", "d"))]


def read(spec, split="train", data_dir=None, on_bad_row="error"):
    return read_source("preferences", Source(str(spec), split, data_dir), "auto", {}, Renderer(), on_bad_row, 20000)


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json", ".jsonl"])
def test_each_file_type_reads_the_same_rows(tmp_path, suffix):
    path = tmp_path / f"prefs{suffix}"
    df = pd.DataFrame(ROWS)
    {".csv": lambda: df.to_csv(path, index=False), ".parquet": lambda: df.to_parquet(path),
     ".json": lambda: path.write_text(json.dumps(ROWS)),
     ".jsonl": lambda: path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))}[suffix]()
    result, fmt = read(path)
    assert (result.rows, fmt) == (EXPECTED, "standard")


def test_parquet_keeps_conversations(tmp_path):
    conv = [{"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}],
             "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no"}]}]
    pd.DataFrame(conv).to_parquet(tmp_path / "c.parquet")
    result, fmt = read(tmp_path / "c.parquet")
    assert fmt == "conversational" and result.rows == [RankedExample(P, (" yes", " no"))]


def test_rows_of_datasets_sources_are_named_by_number(tmp_path):
    path = tmp_path / "prefs.csv"
    pd.DataFrame([ROWS[0], {"prompt": "Q2", "chosen": "c"}]).to_csv(path, index=False)  # empty rejected cell
    with pytest.raises(DataError) as info:
        read(path)
    assert str(info.value) == f"{path}: row 2: missing field 'rejected'" and info.value.line == 2
    result, _ = read(path, on_bad_row="skip")
    assert result.rows == EXPECTED[:1] and result.skipped == {"missing field": 1}


def test_a_directory_loads_like_a_hub_data_set_with_its_split(tmp_path):
    # `load_dataset(<dir>)` resolves the data files and splits as it does for a hub repository.
    (tmp_path / "harmless").mkdir()
    for split, rows in (("train", ROWS[:1]), ("test", ROWS[1:])):
        (tmp_path / "harmless" / f"{split}.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert Source(str(tmp_path)).kind == "dir"
    assert read(tmp_path, "test", data_dir="harmless")[0].rows == EXPECTED[1:]
    assert read(tmp_path, "train", data_dir="harmless")[0].rows == EXPECTED[:1]
    with pytest.raises(DataError, match="cannot load it with datasets"):
        read(tmp_path, "validation", data_dir="harmless")


def test_an_unreachable_hub_data_set_is_named():
    # The tests run with HF_HUB_OFFLINE=1: the hub path is taken and fails with the data set's name.
    src = Source("someone/no-such-dataset", "train", "harmless-base", "main")
    assert src.kind == "hub" and src.name == "no-such-dataset"
    with pytest.raises(DataError, match="someone/no-such-dataset: cannot load it with datasets"):
        source_rows(src)


def test_missing_and_unsupported_paths(tmp_path):
    for spec in (tmp_path / "nope.jsonl", tmp_path / "nope.csv", "./nope"):
        with pytest.raises(DataError, match="file not found"):
            read(spec)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="not a data source"):
        read(tmp_path / "notes.txt")


def test_a_json_row_of_other_types_is_still_a_row_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([ROWS[0], {"prompt": ["x"], "chosen": 1, "rejected": {"a": 1}}]))
    with pytest.raises(DataError, match=r"bad.json: row 2: field 'prompt'") as info:
        read(path)
    assert (info.value.line, info.value.field) == (2, "prompt")
