"""HH transcripts: prompt = the shared conversation up to the last "\\n\\nAssistant:" of the common prefix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_lib.data import DataError
from rlhf_lib.data.hh import split_pair, split_transcript, transcript_messages

A = "\n\nAssistant:"


def test_split_pair_hand_case():
    chosen = "\n\nHuman: hi\n\nAssistant: Hello!\n\nHuman: bye\n\nAssistant: Bye now."
    rejected = "\n\nHuman: hi\n\nAssistant: Hello!\n\nHuman: bye\n\nAssistant: Whatever."
    assert split_pair(chosen, rejected) == ("\n\nHuman: hi\n\nAssistant: Hello!\n\nHuman: bye" + A, " Bye now.",
                                            " Whatever.")


def test_a_response_that_contains_an_assistant_turn_stays_whole():
    # A real HH row (line 1537 of the 1,800-pair sample has this shape): the chosen reply itself contains
    # "\n\nAssistant:", so cutting each text at its own last turn would give two different prompts.
    prompt = "\n\nHuman: find me a serial" + A
    chosen, rejected = " Here's the key:" + A + "  O.k. let's go", " You mean a password?"
    assert split_pair(prompt + chosen, prompt + rejected) == (prompt, chosen, rejected)


def test_responses_sharing_a_first_word_keep_it():
    prompt = "\n\nHuman: q" + A
    assert split_pair(prompt + " I think yes", prompt + " I think no") == (prompt, " I think yes", " I think no")


@pytest.mark.parametrize(("chosen", "rejected", "kind", "field"), [
    ("\n\nHuman: hi", "\n\nHuman: hi" + A + " b", "no assistant turn", "chosen"),
    ("\n\nHuman: hi" + A + " a", "Human: hi Assistant: b", "no assistant turn", "rejected"),
    ("\n\nHuman: hi" + A + " a", "\n\nHuman: yo" + A + " b", "no shared prompt", "rejected"),
    ("\n\nHuman: hi" + A + "  ", "\n\nHuman: hi" + A + " b", "empty reply", "chosen"),
    ("\n\nHuman: hi" + A + " same", "\n\nHuman: hi" + A + " same", "chosen equals rejected", "rejected"),
])
def test_bad_pairs(chosen, rejected, kind, field):
    with pytest.raises(DataError) as info:
        split_pair(chosen, rejected)
    assert (info.value.kind, info.value.field) == (kind, field)


def test_split_transcript():
    assert split_transcript("\n\nHuman: a" + A + " b" + A + " c") == ("\n\nHuman: a" + A + " b" + A, " c")
    with pytest.raises(DataError, match="no '\\\\n\\\\nAssistant:' turn"):
        split_transcript("just text", "text")


# --- properties ----------------------------------------------------------------------------------------------------

turn_text = st.text(max_size=20).filter(lambda s: A not in s and "\n\nHuman:" not in s)
replies = st.text(min_size=1, max_size=20).map(lambda s: " " + s).filter(lambda s: A not in s and s.strip() != "")


@st.composite
def conversations(draw) -> str:
    turns = draw(st.lists(st.tuples(turn_text, turn_text), min_size=0, max_size=3))
    last = draw(turn_text)
    return "".join(f"\n\nHuman: {h}{A} {a}" for h, a in turns) + f"\n\nHuman: {last}{A}"


@settings(max_examples=80, deadline=None)
@given(conversations(), replies, replies)
def test_split_pair_recovers_prompt_and_replies(prompt, a, b):
    # "\n\nAssistant:" has no border (no proper prefix equal to a suffix), so no occurrence can straddle the end of
    # the prompt: the last turn of the common prefix is the prompt's own.
    if a.strip() == b.strip():
        with pytest.raises(DataError, match="identical"):
            split_pair(prompt + a, prompt + b)
    else:
        assert split_pair(prompt + a, prompt + b) == (prompt, a, b)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=60), st.text(max_size=60))
def test_split_pair_raises_only_data_error(chosen, rejected):
    try:
        prompt, a, b = split_pair(chosen, rejected)
    except DataError:
        return
    assert prompt.endswith(A) and chosen == prompt + a and rejected == prompt + b and a.strip() != b.strip()


# Transcripts as messages, for chat templates.

_turn_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).filter(
    lambda t: t.strip() and "\n\nHuman:" not in t and "\n\nAssistant:" not in t)


@given(st.lists(_turn_text, min_size=1, max_size=6))
def test_transcript_messages_round_trip(turns):
    """Alternating turns ending with a human one, as HH prompts are: the messages are those turns, stripped."""
    if len(turns) % 2 == 0:
        turns = turns[:-1]
    roles = ["Human" if i % 2 == 0 else "Assistant" for i in range(len(turns))]
    text = "".join(f"\n\n{r}: {t}" for r, t in zip(roles, turns)) + "\n\nAssistant:"
    got = transcript_messages(text)
    assert [m["role"] for m in got] == ["user" if r == "Human" else "assistant" for r in roles]
    assert [m["content"] for m in got] == [t.strip() for t in turns]


def test_transcript_messages_refuse_what_is_not_a_transcript():
    for text, reason in (("Hello\n\nHuman: hi\n\nAssistant:", "expected an HH transcript"),
                         ("\n\nHuman: \n\nAssistant:", "is empty"),
                         ("\n\nHuman: hi\n\nAssistant: Hello!", "does not end with a human turn")):
        with pytest.raises(DataError, match=reason):
            transcript_messages(text, "chosen")
