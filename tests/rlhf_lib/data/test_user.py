"""User data end to end in the library: bad rows named by file:line:field or skipped and counted, format detection
per source, the seeded held-out split, and SFT/prompts derived from the preferences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_lib.config import DataConfig
from rlhf_lib.data import DataError, RankedExample, SFTExample
from rlhf_lib.data.chat import Renderer
from rlhf_lib.data.checks import DataWarning
from rlhf_lib.data.sources import Source
from rlhf_lib.data.user import build_user_task, pairs_of, read_source, split_heldout

HH = Path(__file__).parents[2] / "fixtures" / "hh_rlhf" / "harmless-240.jsonl"
A = "\n\nAssistant:"


def hh(i: int, a: str = " yes", b: str = " no") -> dict:
    p = f"\n\nHuman: question {i}?{A}"
    return {"chosen": p + a, "rejected": p + b}


def dump(row) -> bytes:
    return json.dumps(row, ensure_ascii=False).encode()


def jsonl(path: Path, rows: list) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else dump(r)) + b"\n" for r in rows))
    return path


RANKED = {"prompt": "Q", "responses": [" a", " b"], "ranking": [1, 0]}
# The bad-row cases of issue 6: (first good row, bad row, reason, field, text of the message)
BAD = [
    (hh(1), b'{"chosen": "x", ', "invalid json", None, "invalid JSON"),
    (hh(1), {"chosen": hh(2)["chosen"]}, "missing field", "rejected", "missing field 'rejected'"),
    (hh(1), {"chosen": hh(2)["chosen"], "rejected": 3}, "wrong type", "rejected", "expected a string, got int"),
    (hh(1), hh(2, a="  "), "empty reply", "chosen", "empty assistant reply"),
    (hh(1), b'{"chosen": "\xff\xfe", "rejected": "b"}', "invalid utf-8", None, "invalid UTF-8"),
    (hh(1), {"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: ho"}, "no assistant turn", "chosen", "Assistant:"),
    (hh(1), hh(2, a=" same", b=" same "), "chosen equals rejected", "rejected", "identical"),
    (RANKED, {"prompt": "Q", "responses": [" a", " a"], "ranking": [0, 1]}, "duplicate responses", "responses", "tie"),
    ({"prompt": "Q", "responses": ["a", "b"], "scores": [1, 0]}, {"prompt": "Q", "responses": ["a", "b"],
                                                                  "scores": [2, 2]}, "tied scores", "scores", "tied"),
    (hh(1), hh(2, a=" " + "x" * 300), "too long", None, "max_chars=200"),
]


@pytest.mark.parametrize(("good", "bad", "reason", "field", "text"), BAD)
def test_bad_rows_name_file_line_and_field_or_are_counted(tmp_path, good, bad, reason, field, text):
    path = jsonl(tmp_path / "prefs.jsonl", [good, bad, good])
    src = Source(str(path))
    with pytest.raises(DataError) as info:
        read_source("preferences", src, "auto", {}, Renderer(), "error", 200)
    assert str(info.value).startswith(f"{path}:2: ") and text in str(info.value)
    assert (info.value.line, info.value.kind, info.value.field) == (2, reason, field)
    with pytest.warns(DataWarning, match=r"1 duplicate row\(s\)"):  # the good row twice: counted as well
        result, _ = read_source("preferences", src, "auto", {}, Renderer(), "skip", 200)
    assert len(result.rows) == 1 and result.skipped == {reason: 1, "duplicate": 1}
    assert result.examples[reason][0].startswith(f"{path}:2: ")


def test_a_format_that_cannot_be_told_fails_even_when_skipping(tmp_path):
    path = jsonl(tmp_path / "prefs.jsonl", [b"garbage", {"question": "Q", "answer": "A"}, hh(1)])
    with pytest.raises(DataError, match=r"prefs.jsonl:2: cannot tell the format") as info:
        read_source("preferences", Source(str(path)), "auto", {}, Renderer(), "skip", 20000)
    assert info.value.kind == "unknown format"
    result, fmt = read_source("preferences", Source(str(path)), "hh", {}, Renderer(), "skip", 20000)
    assert fmt == "hh" and len(result.rows) == 1 and result.skipped == {"invalid json": 1, "missing field": 1}


def test_the_hh_fixture_reads_with_one_real_bad_row():
    with pytest.raises(DataError, match=r"harmless-240.jsonl:69: field 'chosen': the conversation ends with an empty "
                       r"assistant reply"):
        build_user_task(DataConfig(preferences=str(HH)), Renderer())
    task = build_user_task(DataConfig(preferences=str(HH), on_bad_row="skip"), Renderer())
    report = task.sources["preferences"]
    assert (report.format, report.rows, report.skipped) == ("hh", 239, {"empty reply": 1})
    n = {k: len(v) for k, v in task.records.items()}
    assert n["prompts_eval"] == 24 and n["eval_pairs"] == 24 and n["preferences"] == 215  # 239 distinct prompts, 10 %
    assert all(p.prompt.endswith(A) for p in task.records["prompts_eval"])


def test_split_is_seeded_disjoint_and_independent_of_row_order():
    lists = [RankedExample(f"p{i % 7}", (f" a{i}", f" b{i}")) for i in range(20)]
    train, held = split_heldout(lists, 0.3, seed=0)
    assert {ex.prompt for ex in train}.isdisjoint({ex.prompt for ex in held})
    assert len({ex.prompt for ex in held}) == 2  # round(0.3 * 7)
    _, held_again = split_heldout(lists[::-1], 0.3, seed=0)
    assert {ex.prompt for ex in held_again} == {ex.prompt for ex in held}
    with pytest.raises(DataError, match="at least 2"):
        split_heldout(lists[:1], 0.5, seed=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.floats(0.01, 0.99), st.integers(0, 5))
def test_split_holds_out_at_least_one_prompt_and_never_all(n_prompts, fraction, seed):
    lists = [RankedExample(f"p{i}", (" a", " b")) for i in range(n_prompts)]
    train, held = split_heldout(lists, fraction, seed)
    assert 1 <= len(held) <= n_prompts - 1 and len(train) + len(held) == n_prompts


def test_pairs_of_a_ranked_list():
    assert [(p.chosen, p.rejected) for p in pairs_of([RankedExample("Q", ("a", "b", "c"))])] == \
        [("a", "b"), ("a", "c"), ("b", "c")]


def test_sft_and_prompts_come_from_the_training_preferences(tmp_path):
    prefs = jsonl(tmp_path / "p.jsonl", [hh(i) for i in range(10)])
    task = build_user_task(DataConfig(preferences=str(prefs), eval_fraction=0.2), Renderer())
    held = {p.prompt for p in task.records["prompts_eval"]}
    assert len(held) == 2 and {p.prompt for p in task.records["eval_pairs"]} == held
    assert [ex.response for ex in task.records["sft"]] == [" yes"] * 8
    assert {ex.prompt for ex in task.records["sft"]} == {p.prompt for p in task.records["prompts_train"]}
    assert held.isdisjoint(ex.prompt for ex in task.records["sft"])


def test_explicit_sources_and_held_out_prompts_are_dropped_from_training(tmp_path):
    prefs = jsonl(tmp_path / "p.jsonl", [hh(i) for i in range(6)])
    test = jsonl(tmp_path / "t.jsonl", [hh(0), hh(9)])
    sft = jsonl(tmp_path / "s.jsonl", [
        {"messages": [{"role": "user", "content": "question 0?"}, {"role": "assistant", "content": "Sure."}]},
        {"messages": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "ok"}]}])
    prompts = jsonl(tmp_path / "q.jsonl", [{"prompt": hh(i)["chosen"][: -len(" yes")]} for i in (0, 1, 2)])
    cfg = DataConfig(preferences=str(prefs), eval_preferences=str(test), sft=str(sft), prompts=str(prompts))
    task = build_user_task(cfg, Renderer())
    assert task.sources["sft"].format == "messages" and task.rendering == "hh"
    assert [p.prompt for p in task.records["prompts_eval"]] == [hh(0)["chosen"][:-4], hh(9)["chosen"][:-4]]
    # question 0 is held out: its preference list, SFT row and PPO prompt are dropped from training.
    assert task.dropped == {"sft": 1, "preferences": 1, "prompts_train": 1}
    assert task.records["sft"] == [SFTExample("\n\nHuman: other" + A, " ok")]
    assert len(task.records["preferences"]) == 5 and len(task.records["prompts_train"]) == 2


def test_nothing_left_to_train_on_is_an_error(tmp_path):
    prefs = jsonl(tmp_path / "p.jsonl", [hh(0), hh(1)])
    cfg = DataConfig(preferences=str(prefs), eval_preferences=str(prefs))
    with pytest.raises(DataError, match="no sft rows left after holding out"):
        build_user_task(cfg, Renderer())


def test_a_category_column_rides_along_to_the_held_out_pairs(tmp_path):
    from rlhf_lib.data import read_pairs, write_jsonl

    rows = [hh(i) | {"cat": "chat" if i % 2 else "safety"} for i in range(10)]
    prefs = jsonl(tmp_path / "p.jsonl", rows)
    cfg = DataConfig(preferences=str(prefs), eval_fraction=0.4, preferences_columns={"category": "cat"})
    task = build_user_task(cfg, Renderer())
    pairs = task.records["eval_pairs"]
    assert {p.category for p in pairs} <= {"chat", "safety"} and all(p.category for p in pairs)
    back = read_pairs(write_jsonl(tmp_path / "pairs.jsonl", pairs)).rows
    assert back == pairs  # written and read back with the category
    # Without the column nothing changes: the files carry no category key at all.
    plain = build_user_task(DataConfig(preferences=str(jsonl(tmp_path / "q.jsonl", [hh(i) for i in range(10)]))),
                            Renderer())
    write_jsonl(tmp_path / "plain.jsonl", plain.records["eval_pairs"])
    assert all("category" not in json.loads(line) for line in (tmp_path / "plain.jsonl").read_text().splitlines())


def test_a_category_that_is_not_text_names_the_field(tmp_path):
    prefs = jsonl(tmp_path / "p.jsonl", [hh(1) | {"category": ["a"]}])
    with pytest.raises(DataError, match="field 'category': expected a string, got list"):
        read_source("preferences", Source(str(prefs)), "auto", {}, Renderer(), "error", 20000)


def test_max_rows_keeps_the_first_valid_rows_of_each_source(tmp_path):
    prefs = jsonl(tmp_path / "prefs.jsonl", [hh(1), hh(2, a="  "), *(hh(i) for i in range(3, 30))])
    held = jsonl(tmp_path / "held.jsonl", [hh(i) for i in range(100, 120)])
    cfg = DataConfig(preferences=str(prefs), eval_preferences=str(held), on_bad_row="skip", max_rows=5)
    task = build_user_task(cfg, Renderer())
    assert [ex.prompt for ex in task.records["preferences"]] == [hh(i)["chosen"][:-4] for i in (1, 3, 4, 5, 6)]
    assert len(task.records["eval_pairs"]) == 5 and task.sources["preferences"].skipped == {"empty reply": 1}


def test_duplicate_contradicting_and_nul_rows_are_warned_about_or_dropped(tmp_path):
    rows = [hh(1), hh(2), hh(1), hh(3, a=" no", b=" yes"), hh(3), hh(4, a=" y\u0000es"), hh(5)]
    path = jsonl(tmp_path / "p.jsonl", rows)
    with pytest.warns(DataWarning) as caught:
        kept, _ = read_source("preferences", Source(str(path)), "auto", {}, Renderer(), "error", 20000)
    message = str(caught[0].message)
    assert message == (f"{path}: 1 NUL byte row(s) (first: {path}:6), 1 duplicate row(s) (first: {path}:3), "
                       f"2 contradicting row(s) (first: {path}:4); kept; data.on_bad_row=skip drops them")
    assert len(kept.rows) == 7
    with pytest.warns(DataWarning, match="dropped"):
        result, _ = read_source("preferences", Source(str(path)), "auto", {}, Renderer(), "skip", 20000)
    assert [r.prompt for r in result.rows] == [kept.rows[i].prompt for i in (0, 1, 6)]
    assert result.skipped == {"NUL byte": 1, "duplicate": 1, "contradicting": 2}


def test_clean_data_gives_no_warning(tmp_path, recwarn):
    path = jsonl(tmp_path / "p.jsonl", [hh(i) for i in range(5)])
    read_source("preferences", Source(str(path)), "auto", {}, Renderer(), "error", 20000)
    assert not [w for w in recwarn if "row(s)" in str(w.message)]


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=12))
def test_suspicious_rows_by_hand_rule(rows):
    # Property: a pair counts as contradicting exactly when its reverse is also present; duplicates are repeats.
    from rlhf_lib.data.checks import suspicious_rows

    records = [RankedExample(f"p{q}", (" a", " b") if up else (" b", " a")) for q, up in rows]
    found = suspicious_rows("preferences", records)
    firsts = {}
    for i, r in enumerate(records):
        firsts.setdefault(r, i)
    assert found.get("duplicate", []) == [i for i, r in enumerate(records) if firsts[r] != i]
    flipped = {RankedExample(r.prompt, r.responses[::-1]) for r in records}
    assert found.get("contradicting", []) == [i for i, r in enumerate(records) if r in flipped and firsts[r] == i]


def test_max_train_rows_caps_the_training_rows_and_leaves_the_held_out_pairs_alone(tmp_path):
    """A learning curve: 3 training rows, then 6, each scored on the same held-out pairs (`data.max_rows` 8 caps
    both; the smaller cap counts). A bad row is skipped before it counts, as with max_rows."""
    prefs = jsonl(tmp_path / "prefs.jsonl", [hh(1), hh(2, a="  "), *(hh(i) for i in range(3, 30))])
    held = jsonl(tmp_path / "held.jsonl", [hh(i) for i in range(100, 120)])
    base = dict(preferences=str(prefs), eval_preferences=str(held), on_bad_row="skip", max_rows=8)
    small = build_user_task(DataConfig(**base, max_train_rows=3), Renderer())
    large = build_user_task(DataConfig(**base, max_train_rows=6), Renderer())
    capped = build_user_task(DataConfig(**base, max_train_rows=50), Renderer())
    assert [ex.prompt for ex in small.records["preferences"]] == [hh(i)["chosen"][:-4] for i in (1, 3, 4)]
    assert len(large.records["preferences"]) == 6 and len(capped.records["preferences"]) == 8
    assert small.records["eval_pairs"] == large.records["eval_pairs"] == capped.records["eval_pairs"]
    assert len(small.records["eval_pairs"]) == 8
    assert "max_train_rows" not in DataConfig(**base).key()
    assert DataConfig(**base, max_train_rows=3).key()["max_train_rows"] == 3
    with pytest.raises(ValueError, match="data.max_train_rows needs data.eval_preferences"):
        DataConfig(preferences=str(prefs), max_train_rows=5)


def test_skip_rows_declares_a_split_of_the_training_file_and_reads_held_out_from_the_start(tmp_path):
    """Rows 0-4 for one reward model, rows 5-9 for another (a judge PPO never trained against): `data.skip_rows`
    leaves out the first valid rows of the training sources only, before `max_rows` counts."""
    prefs = jsonl(tmp_path / "prefs.jsonl", [hh(1), hh(2, a="  "), *(hh(i) for i in range(3, 30))])
    held = jsonl(tmp_path / "held.jsonl", [hh(i) for i in range(100, 120)])
    base = dict(preferences=str(prefs), eval_preferences=str(held), on_bad_row="skip", max_rows=5)
    first = build_user_task(DataConfig(**base), Renderer())
    second = build_user_task(DataConfig(**base, skip_rows=5), Renderer())
    assert [ex.prompt for ex in second.records["preferences"]] == [hh(i)["chosen"][:-4] for i in range(7, 12)]
    assert not {ex.prompt for ex in first.records["preferences"]} & {ex.prompt for ex in second.records["preferences"]}
    assert second.records["eval_pairs"] == first.records["eval_pairs"]  # held-out pairs from the start, as before
    assert second.sources["preferences"].skipped == {"empty reply": 1}  # skipped rows are still checked
    assert "skip_rows" not in DataConfig(**base).key() and DataConfig(**base, skip_rows=5).key()["skip_rows"] == 5
    with pytest.raises(ValueError, match="data.skip_rows needs data.eval_preferences"):
        DataConfig(preferences=str(prefs), skip_rows=5)
