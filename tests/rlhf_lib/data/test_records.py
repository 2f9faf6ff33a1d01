"""Readers/validators of the JSONL data contract: every bad-row case, skip mode, round trips, and fuzzing."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlhf_lib.data import (
    DataError,
    PairExample,
    PromptExample,
    RankedExample,
    SFTExample,
    file_fingerprint,
    read_pairs,
    read_prompts,
    read_ranked,
    read_sft,
    write_jsonl,
)

P = "\n\nHuman: Any tips about chess?\n\nAssistant:"
OK = {
    "sft": {"prompt": P, "response": " Sure."},
    "ranked": {"prompt": P, "responses": [" a", " b", " c"], "ranking": [2, 0, 1]},
    "prompts": {"prompt": P},
    "pairs": {"prompt": P, "chosen": " good", "rejected": " bad"},
}
READERS: dict[str, Callable[..., Any]] = {
    "sft": read_sft, "ranked": read_ranked, "prompts": read_prompts, "pairs": read_pairs,
}


def dump(row: Any) -> bytes:
    return json.dumps(row, ensure_ascii=False).encode("utf-8")


def with_bad_line(tmp_path: Path, kind: str, bad: bytes, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(dump(OK[kind]) + b"\n" + bad + b"\n" + dump(OK[kind]) + b"\n")
    return path


# (reader, bad line, skip reason, field or None, text the message must contain)
BAD: list[tuple[str, bytes, str, str | None, str]] = [
    ("sft", b'\xff\xfe{"prompt": 1}', "invalid utf-8", None, "invalid UTF-8"),
    ("sft", b'{"prompt": "x",', "invalid json", None, "invalid JSON"),
    ("ranked", b"[" * 100_000, "invalid json", None, "invalid JSON"),
    ("sft", b"[1, 2]", "not an object", None, "expected a JSON object, got list"),
    ("sft", dump({"prompt": P}), "missing field", "response", "missing field 'response'"),
    ("pairs", dump({"prompt": P, "chosen": " a"}), "missing field", "rejected", "missing field 'rejected'"),
    ("ranked", dump({"prompt": P, "responses": [" a", " b"]}), "missing field", "ranking", "missing field 'ranking'"),
    ("prompts", dump({"text": P}), "missing field", "prompt", "missing field 'prompt'"),
    ("sft", dump({"prompt": P, "response": 3}), "wrong type", "response", "field 'response': expected a string, got int"),
    ("prompts", dump({"prompt": None}), "wrong type", "prompt", "got null"),
    ("ranked", dump({"prompt": P, "responses": 3, "ranking": [0]}), "wrong type", "responses",
     "field 'responses': expected a list of strings, got int"),
    ("ranked", dump({"prompt": P, "responses": [" a", 2], "ranking": [0, 1]}), "wrong type", "responses", "item 1 is int"),
    ("ranked", dump({"prompt": P, "responses": [" a", " b"], "ranking": "01"}), "wrong type", "ranking", "field 'ranking'"),
    ("ranked", dump({"prompt": P, "responses": [" a", " b"], "ranking": [True, False]}), "wrong type", "ranking",
     "field 'ranking'"),
    ("sft", dump({"prompt": P, "response": "  \n\t"}), "empty text", "response", "field 'response': empty"),
    ("pairs", dump({"prompt": P, "chosen": "", "rejected": " b"}), "empty text", "chosen", "field 'chosen'"),
    ("ranked", dump({"prompt": P, "responses": [" a", " "], "ranking": [0, 1]}), "empty text", "responses", "item 1"),
    ("sft", b'{"prompt": "' + P.encode("unicode_escape") + b'", "response": "\\ud800"}', "invalid text", "response",
     "lone surrogate"),
    ("prompts", dump({"prompt": " "}), "empty text", "prompt", "field 'prompt': empty"),
    ("pairs", dump({"prompt": P, "chosen": " same", "rejected": " same"}), "chosen equals rejected", "rejected",
     "'chosen' and 'rejected'"),
    ("ranked", dump({"prompt": P, "responses": [" a"], "ranking": [0]}), "too few responses", "responses", ">= 2"),
    ("ranked", dump({"prompt": P, "responses": [" a", " b", " a"], "ranking": [0, 1, 2]}), "duplicate responses",
     "responses", "duplicate"),
    ("ranked", dump({"prompt": P, "responses": [" a", " b"], "ranking": [0, 0]}), "bad ranking", "ranking",
     "permutation of 0..1"),
    ("ranked", dump({"prompt": P, "responses": [" a", " b"], "ranking": [1, 2]}), "bad ranking", "ranking", "[1, 2]"),
    ("ranked", dump({"prompt": P, "responses": [" a", " b"], "ranking": [0]}), "bad ranking", "ranking", "permutation"),
    ("sft", dump({"prompt": P, "response": "x" * 20_001}), "too long", None, "max_chars=20000"),
    ("ranked", dump({"prompt": P, "responses": ["x" * 10_000, "y" * 10_000], "ranking": [0, 1]}), "too long", None,
     "characters of text"),
    ("prompts", dump({"prompt": P, "answer": [85]}), "wrong type", "answer",
     "field 'answer': expected a string, number, bool or null, got list"),
    ("prompts", dump({"prompt": P, "meta": {"a": 1}}), "wrong type", "meta", "got object"),
    ("prompts", b'{"prompt": "' + P.encode("unicode_escape") + b'", "answer": NaN}', "wrong type", "answer",
     "expected a finite number"),
    ("prompts", b'{"prompt": "' + P.encode("unicode_escape") + b'", "answer": "\\ud800"}', "invalid text", "answer",
     "lone surrogate"),
    ("prompts", dump({"prompt": P, "answer": "x" * 20_000}), "too long", None, "max_chars=20000"),
]


@pytest.mark.parametrize(("kind", "bad", "reason", "field", "text"), BAD)
def test_bad_row_raises_with_file_line_and_field(tmp_path: Path, kind: str, bad: bytes, reason: str,
                                                 field: str | None, text: str) -> None:
    path = with_bad_line(tmp_path, kind, bad, name="prefs.jsonl")
    with pytest.raises(DataError) as info:
        READERS[kind](path)
    err = info.value
    assert str(err).startswith(f"{path}:2: "), str(err)
    assert text in str(err)
    assert (err.line, err.kind, err.field) == (2, reason, field)
    if field is not None:
        assert f"'{field}'" in str(err)
    assert pickle.loads(pickle.dumps(err)).line == 2


@pytest.mark.parametrize(("kind", "bad", "reason", "field", "text"), BAD)
def test_skip_mode_counts_the_reason(tmp_path: Path, kind: str, bad: bytes, reason: str, field: str | None,
                                     text: str) -> None:
    result = READERS[kind](with_bad_line(tmp_path, kind, bad), on_bad_row="skip")
    assert len(result.rows) == 2 and result.skipped == {reason: 1}


def test_skip_mode_counts_several_reasons(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    bad = [b"nope", b"[]", dump({"prompt": P}), dump({"prompt": P}), dump({"prompt": P, "response": ""})]
    path.write_bytes(b"\n".join([dump(OK["sft"]), *bad, b"", b"   ", dump(OK["sft"])]))
    result = read_sft(path, on_bad_row="skip")
    assert result.rows == [SFTExample(P, " Sure.")] * 2
    assert result.skipped == {"invalid json": 1, "not an object": 1, "missing field": 2, "empty text": 1}
    assert result.path == path


def test_prompts_need_no_hh_turn_and_sft_prompts_may_be_empty(tmp_path: Path) -> None:
    # The HH-transcript rule belongs to the hh format (tests/rlhf_lib/data/test_hh.py); the pipeline's own files
    # also hold chat-template prompts, TRL-standard prompts and plain-text SFT (empty prompt).
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "", "response": "all of it"}, {"prompt": "Q?", "response": " A"}])
    assert read_sft(path).rows == [SFTExample("", "all of it"), SFTExample("Q?", " A")]
    assert read_prompts(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "<|user|>hi<|assistant|>"}])).rows


def test_skip_mode_keeps_the_first_messages_of_each_reason(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join([dump(OK["prompts"])] + [b"nope"] * 5))
    result = read_prompts(path, on_bad_row="skip")
    assert result.skipped == {"invalid json": 5}
    assert result.examples["invalid json"][0].startswith(f"{path}:2: invalid JSON")
    assert len(result.examples["invalid json"]) == 3


def test_ranking_is_applied_best_first(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [OK["ranked"]])
    assert read_ranked(path).rows == [RankedExample(P, (" c", " a", " b"))]


def test_blank_lines_crlf_bom_and_extra_fields(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + dump({"prompt": P, "id": 7}) + b"\r\n\r\n\n" + dump(OK["prompts"]))
    assert read_prompts(path).rows == [PromptExample(P, {"id": 7}), PromptExample(P)]  # prompts keep their columns


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"garbage\n[1]\n"])
def test_no_valid_rows_is_an_error_naming_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match="no valid rows") as info:
        read_pairs(path, on_bad_row="skip")
    assert str(path) in str(info.value)


def test_missing_file_and_bad_option(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="missing.jsonl: file not found"):
        read_sft(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="cannot read"):
        read_sft(tmp_path)  # a directory
    with pytest.raises(ValueError, match="on_bad_row"):
        read_sft(write_jsonl(tmp_path / "s.jsonl", [OK["sft"]]), on_bad_row="ignore")  # type: ignore[arg-type]


def test_max_chars_is_configurable(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [OK["sft"]])
    assert read_sft(path, max_chars=len(P) + 6).rows
    with pytest.raises(DataError, match="too long"):
        read_sft(path, max_chars=len(P) + 5)


def test_write_jsonl_is_atomic_and_deterministic(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "sub" / "x.jsonl", [{"prompt": P, "response": " é ✓ \u2028"}, SFTExample(P, " b")])
    first = path.read_bytes()
    assert first.count(b"\n") == 2 and "é ✓ \u2028".encode() in first  # ensure_ascii=False, U+2028 not a row break
    assert read_sft(path).rows[0].response == " é ✓ \u2028"
    assert write_jsonl(path, read_sft(path).rows).read_bytes() == first

    def failing() -> Any:
        yield {"prompt": P, "response": " new"}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_jsonl(path, failing())
    assert path.read_bytes() == first  # the old file survives a failed write
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.jsonl"]  # no temp file left behind


def test_file_fingerprint(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", [OK["prompts"]])
    assert file_fingerprint(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    before = file_fingerprint(path)
    write_jsonl(path, [OK["prompts"], OK["prompts"]])
    assert file_fingerprint(path) != before
    with pytest.raises(DataError):
        file_fingerprint(tmp_path / "nope")


# --- property tests -----------------------------------------------------------------------------------------------

texts = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
prompts = st.builds(lambda h, a: f"\n\nHuman: {h}\n\nAssistant:{a}", st.text(max_size=30), st.text(max_size=10))
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.lists(st.builds(SFTExample, prompts, texts), min_size=1, max_size=5))
def test_round_trip_sft(tmp_path: Path, rows: list[SFTExample]) -> None:
    assert read_sft(write_jsonl(tmp_path / "s.jsonl", rows)).rows == rows


@FUZZ
@given(st.lists(st.builds(PairExample, prompts, texts, texts), min_size=1, max_size=5))
def test_round_trip_pairs(tmp_path: Path, rows: list[PairExample]) -> None:
    assume(all(r.chosen.strip() != r.rejected.strip() for r in rows))
    assert read_pairs(write_jsonl(tmp_path / "p.jsonl", rows)).rows == rows
    # As prompts, the pairs' other fields are columns.
    columns = [{"chosen": r.chosen, "rejected": r.rejected} for r in rows]
    assert read_prompts(tmp_path / "p.jsonl").rows == [PromptExample(r.prompt, c) for r, c in zip(rows, columns)]


@FUZZ
@given(prompts, st.lists(texts, min_size=2, max_size=5, unique_by=str.strip), st.data())
def test_round_trip_ranked(tmp_path: Path, prompt: str, responses: list[str], data: st.DataObject) -> None:
    ranking = data.draw(st.permutations(range(len(responses))))
    path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": prompt, "responses": responses, "ranking": ranking}])
    (ex,) = read_ranked(path).rows
    assert ex == RankedExample(prompt, tuple(responses[i] for i in ranking))
    assert read_ranked(write_jsonl(path, [ex])).rows == [ex]  # best-first records write back unchanged


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(
    max_size=10)
column_names = st.text(max_size=8).filter(lambda k: k != "prompt")


@FUZZ
@given(prompts, st.dictionaries(column_names, scalars, max_size=4))
def test_prompt_columns_round_trip(tmp_path: Path, prompt: str, columns: dict[str, Any]) -> None:
    # Every field but "prompt" comes back as a column, with its JSON type (a row with only "prompt": no columns).
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": prompt, **columns}, {"prompt": prompt}])
    first, plain = read_prompts(path).rows
    assert first == PromptExample(prompt, columns) and plain == PromptExample(prompt, {})
    assert {k: type(v) for k, v in first.columns.items()} == {k: type(v) for k, v in columns.items()}
    assert hash(first) == hash(plain)  # hashable; the columns are not part of the hash


@FUZZ
@given(prompts, st.dictionaries(column_names, scalars, max_size=3), column_names,
       st.lists(scalars, max_size=2) | st.dictionaries(st.text(max_size=3), scalars, max_size=2))
def test_a_list_or_object_column_is_a_bad_row_naming_it(tmp_path: Path, prompt: str, columns: dict[str, Any],
                                                        name: str, nested: Any) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": prompt, **columns, name: nested}])
    with pytest.raises(DataError) as info:
        read_prompts(path)
    assert (info.value.line, info.value.field, info.value.kind) == (1, name, "wrong type")
    assert f"{path}:1: field {name!r}" in str(info.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10) | st.just(P),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from(["prompt", "response", "responses", "ranking", "chosen", "rejected", "x"])
lines_ = st.one_of(
    st.binary(max_size=60),
    st.dictionaries(keys, json_values, max_size=6).map(dump),
    st.text(max_size=30).map(lambda s: s.encode("utf-8", "surrogatepass")),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines_, max_size=6), st.sampled_from(sorted(READERS)), st.sampled_from(["error", "skip"]))
def test_arbitrary_lines_raise_only_data_error(tmp_path: Path, lines: list[bytes], kind: str, mode: str) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines))
    try:
        result = READERS[kind](path, on_bad_row=mode)
    except DataError as e:
        assert str(path) in str(e)
    else:
        assert result.rows and all(isinstance(n, int) and n > 0 for n in result.skipped.values())


def test_a_prompt_with_columns_is_written_flat_and_reads_back(tmp_path):
    from rlhf_lib.data.jsonl import as_row

    ex = PromptExample("\n\nHuman: What is 1 + 2?\n\nAssistant:", {"answer": "3"})
    assert as_row(ex) == {"prompt": ex.prompt, "answer": "3"}
    path = write_jsonl(tmp_path / "p.jsonl", [ex, PromptExample("plain")])
    assert [r.columns for r in read_prompts(path).rows] == [{"answer": "3"}, {}]
