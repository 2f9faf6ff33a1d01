"""User formats: detection from the columns, and each format's rows as the pipeline's records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_lib.data import DataError, PromptExample, RankedExample, SFTExample
from rlhf_lib.data.chat import Renderer
from rlhf_lib.data.fields import Fields
from rlhf_lib.data.formats import detect, parse_preference, parse_prompt, parse_sft

A = "\n\nAssistant:"
P = "\n\nHuman: hi" + A
U = [{"role": "user", "content": "hi"}]


def ans(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize(("kind", "row", "mapping", "fmt"), [
    ("preferences", {"chosen": P + " a", "rejected": P + " b"}, {}, "hh"),
    ("preferences", {"prompt": "Q?", "chosen": " a", "rejected": " b"}, {}, "standard"),
    ("preferences", {"chosen": U + ans("a"), "rejected": U + ans("b")}, {}, "conversational"),
    ("preferences", {"prompt": U, "chosen": ans("a"), "rejected": ans("b")}, {}, "conversational"),
    ("preferences", {"prompt": "Q", "responses": ["a", "b"], "ranking": [1, 0]}, {}, "ranked"),
    ("preferences", {"prompt": "Q", "responses": ["a", "b"], "scores": [1, 2]}, {}, "scored"),
    ("preferences", {"question": "Q", "response_j": "a", "response_k": "b"},
     {"prompt": "question", "chosen": "response_j", "rejected": "response_k"}, "standard"),
    ("sft", {"prompt": "Q", "completion": "A"}, {}, "prompt_completion"),
    ("sft", {"prompt": P, "response": " A"}, {}, "prompt_completion"),
    ("sft", {"messages": U + ans("a")}, {}, "messages"),
    ("sft", {"text": "anything"}, {}, "text"),
    ("prompts", {"prompt": "Q", "id": 3}, {}, "prompt"),
])
def test_detect(kind, row, mapping, fmt):
    assert detect(kind, row, mapping) == fmt


@pytest.mark.parametrize(("kind", "row", "match"), [
    ("preferences", {"question": "Q"}, "cannot tell the format"),
    ("preferences", {"prompt": "Q", "responses": ["a", "b"], "ranking": [0, 1], "scores": [1, 0]}, "ranked and scored"),
    ("preferences", {"chosen": "a", "rejected": "b", "responses": ["a", "b"], "ranking": [0, 1]}, "hh and ranked"),
    ("preferences", {"prompt": P, "chosen": P + " a", "rejected": P + " b"}, "repeats 'prompt'"),
    ("sft", {"messages": U + ans("a"), "text": "t"}, "messages and text"),
    ("prompts", {"text": "Q"}, "data.prompts_columns"),
])
def test_detect_refuses_to_guess(kind, row, match):
    with pytest.raises(DataError, match=match) as info:
        detect(kind, row)
    assert info.value.kind == "unknown format" and f"data.{kind}_format" in str(info.value)


def pref(fmt, row, mapping=None, renderer=None):
    return parse_preference(fmt, Fields(row, mapping), renderer or Renderer())


def test_preference_formats_give_best_first_lists():
    assert pref("hh", {"chosen": P + " a", "rejected": P + " b"}) == RankedExample(P, (" a", " b"))
    assert pref("standard", {"prompt": "Q?", "chosen": " a", "rejected": " b"}) == RankedExample("Q?", (" a", " b"))
    # Without a chat template, conversations become HH transcripts; replies get the space after "Assistant:".
    assert pref("conversational", {"chosen": U + ans("a"), "rejected": U + ans("b")}) == RankedExample(P, (" a", " b"))
    assert pref("conversational", {"prompt": U, "chosen": ans("a"), "rejected": ans("b")}) == \
        RankedExample(P, (" a", " b"))
    assert pref("ranked", {"prompt": "Q", "responses": ["x", "y", "z"], "ranking": [2, 0, 1]}) == \
        RankedExample("Q", ("z", "x", "y"))
    assert pref("scored", {"prompt": "Q", "responses": ["x", "y", "z"], "scores": [0.5, -1, 7]}) == \
        RankedExample("Q", ("z", "x", "y"))
    assert pref("ranked", {"prompt": U, "responses": ["x", "y"], "ranking": [1, 0]}) == RankedExample(P, (" y", " x"))
    assert pref("standard", {"q": "Q", "good": "a", "bad": "b"}, {"prompt": "q", "chosen": "good", "rejected": "bad"}) \
        == RankedExample("Q", ("a", "b"))


@pytest.mark.parametrize(("fmt", "row", "kind", "field"), [
    ("scored", {"prompt": "Q", "responses": ["x", "y", "z"], "scores": [1, 2, 1]}, "tied scores", "scores"),
    ("scored", {"prompt": "Q", "responses": ["x", "y"], "scores": [1]}, "bad scores", "scores"),
    ("scored", {"prompt": "Q", "responses": ["x", "y"], "scores": [1, True]}, "wrong type", "scores"),
    ("scored", {"prompt": "Q", "responses": ["x", "y"], "scores": [1, float("nan")]}, "wrong type", "scores"),
    ("ranked", {"prompt": "Q", "responses": ["x", "x "], "ranking": [0, 1]}, "duplicate responses", "responses"),
    ("standard", {"prompt": "Q", "chosen": "a", "rejected": 3}, "wrong type", "rejected"),
    ("conversational", {"chosen": U + ans("a"), "rejected": U + ans("a")}, "chosen equals rejected", "rejected"),
    ("conversational", {"chosen": U + ans("a"), "rejected": [{"role": "user", "content": "yo"}] + ans("b")},
     "no shared prompt", "rejected"),
    ("conversational", {"chosen": ans("a") + U, "rejected": ans("a") + [{"role": "user", "content": "x"}]},
     "not an assistant reply", "chosen"),
    ("conversational", {"prompt": U, "chosen": U, "rejected": ans("b")}, "not an assistant reply", "chosen"),
    ("conversational", {"chosen": [{"role": "user"}], "rejected": ans("b")}, "missing field", "chosen"),
    ("conversational", {"chosen": U + [{"role": "assistant", "content": ""}], "rejected": U + ans("b")},
     "empty text", "chosen"),
    ("standard", {"prompt": ans("a"), "chosen": "x", "rejected": "y"}, "prompt ends with assistant", "prompt"),
])
def test_bad_preference_rows(fmt, row, kind, field):
    with pytest.raises(DataError) as info:
        pref(fmt, row)
    assert (info.value.kind, info.value.field) == (kind, field)


def test_errors_name_the_users_column():
    with pytest.raises(DataError, match="field 'response_k': expected a string") as info:
        pref("standard", {"question": "Q", "response_j": "a", "response_k": 1},
             {"prompt": "question", "chosen": "response_j", "rejected": "response_k"})
    assert info.value.field == "response_k"


def test_sft_formats():
    r = Renderer()
    assert parse_sft("prompt_completion", Fields({"prompt": "Q", "completion": "A"}), r) == SFTExample("Q", "A")
    assert parse_sft("prompt_completion", Fields({"prompt": P, "response": " A"}), r) == SFTExample(P, " A")
    assert parse_sft("prompt_completion", Fields({"prompt": U, "completion": ans("A")}), r) == SFTExample(P, " A")
    assert parse_sft("messages", Fields({"messages": U + ans("A")}), r) == SFTExample(P, " A")
    assert parse_sft("text", Fields({"text": P + " A"}), r) == SFTExample(P, " A")
    assert parse_sft("text", Fields({"text": "plain text"}), r) == SFTExample("", "plain text")
    with pytest.raises(DataError, match="ending with the assistant's reply"):
        parse_sft("messages", Fields({"messages": U}), r)
    assert parse_prompt("prompt", Fields({"prompt": U}), r) == PromptExample(P)
    assert parse_prompt("prompt", Fields({"prompt": "Q"}), r) == PromptExample("Q")


# --- properties ----------------------------------------------------------------------------------------------------

texts = st.text(min_size=1, max_size=12).filter(lambda s: s.strip() != "")


@settings(max_examples=60, deadline=None)
@given(st.lists(texts, min_size=2, max_size=6, unique_by=str.strip), st.data())
def test_scored_lists_come_out_in_descending_score_order(responses, data):
    scores = data.draw(st.lists(st.floats(-1e6, 1e6), min_size=len(responses), max_size=len(responses), unique=True))
    ex = pref("scored", {"prompt": "Q", "responses": responses, "scores": scores})
    by_text = dict(zip(responses, scores))
    assert sorted(ex.responses) == sorted(responses)
    assert [by_text[r] for r in ex.responses] == sorted(scores, reverse=True)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.just(P + " x"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner,
                                                                max_size=3),
    max_leaves=8,
)
cols = st.sampled_from(["prompt", "chosen", "rejected", "responses", "ranking", "scores", "completion", "messages",
                        "text"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(cols, json_values, max_size=5),
       st.sampled_from(["hh", "standard", "conversational", "ranked", "scored", "prompt_completion", "messages",
                        "text", "prompt"]))
def test_arbitrary_rows_raise_only_data_error(row, fmt):
    parse = {"prompt": parse_prompt, "prompt_completion": parse_sft, "messages": parse_sft, "text": parse_sft}
    try:
        parse.get(fmt, parse_preference)(fmt, Fields(row), Renderer())
    except DataError as e:
        assert e.kind
