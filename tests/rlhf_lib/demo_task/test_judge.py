"""The gold judge: preferences on hand-built responses, consistency with the generator, robustness to any text."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_lib.demo_task import (
    BROAD_MIX,
    SFT_MIX,
    TOPICS,
    gold_breakdown,
    gold_score,
    judge,
    make_prompt,
    sample_response,
)

PROMPT = make_prompt("chess", 0)
F = TOPICS["chess"]
BEST = f" Happy to help! {F[0]} {F[1]} {F[2]} Good luck!"


def g(response: str, prompt: str = PROMPT) -> float:
    return gold_score(prompt, response)


def test_best_response_is_ideal() -> None:
    parts = gold_breakdown(PROMPT, BEST)
    assert parts == {"topic": 0.75, "tone": 0.5, "detail": 1.5, "length": 0.0, "repetition": 0.0, "ending": 0.4}
    assert g(BEST) == sum(parts.values())
    assert len(BEST.split()) <= judge.IDEAL_MAX_WORDS


def test_polite_beats_neutral_beats_rude() -> None:
    body = f" {F[0]} {F[1]} Good luck!"
    assert g(" Glad to help!" + body) > g(" Okay." + body) > g(" What a dumb question." + body)


def test_on_topic_beats_off_topic() -> None:
    off = TOPICS["yoga"]
    assert g(f" Happy to help! {F[0]} {F[1]} Good luck!") > g(f" Happy to help! {off[0]} {off[1]} Good luck!")
    assert g(" Happy to help! Here is advice on chess. Good luck!") > g(" Happy to help! Here is advice on yoga. Good luck!")


def test_two_facts_beat_none() -> None:
    assert g(f" Happy to help! {F[3]} {F[4]} Good luck!") > g(" Happy to help! Here is advice on chess. Good luck!")


def test_facts_count_once_and_cap_at_three() -> None:
    three = gold_breakdown(PROMPT, f" {F[0]} {F[1]} {F[2]}")["detail"]
    assert gold_breakdown(PROMPT, f" {F[0]} {F[1]} {F[2]} {F[3]}")["detail"] == three
    assert gold_breakdown(PROMPT, f" {F[0]} {F[0]}")["detail"] == gold_breakdown(PROMPT, f" {F[0]}")["detail"]


def test_ideal_length_beats_padding() -> None:
    padded = f" Happy to help! {F[0]} It depends. {F[1]} Everyone is different. {F[2]} There is a lot to say. " \
             "It takes time. Many people like it. Good luck!"
    assert len(padded.split()) > judge.IDEAL_MAX_WORDS + 5
    assert g(BEST) - g(padded) >= 0.5
    assert gold_breakdown(PROMPT, padded)["length"] < 0
    assert gold_breakdown(PROMPT, " Good luck!")["length"] < 0  # very short answers lose a little too


def test_repetition_is_penalised() -> None:
    repeated = f" Happy to help! {F[0]} {F[0]} {F[1]} Good luck!"
    distinct = f" Happy to help! {F[0]} {F[2]} {F[1]} Good luck!"
    assert gold_breakdown(PROMPT, repeated)["repetition"] <= -judge.W_DUP_SENTENCE
    assert gold_breakdown(PROMPT, distinct)["repetition"] == 0.0
    assert g(distinct) > g(repeated)
    assert gold_breakdown(PROMPT, " chess chess chess chess chess chess chess")["repetition"] == -judge.MAX_REPETITION_PENALTY


def test_a_looped_word_is_penalised_and_still_says_its_sentence() -> None:
    looped = f" Happy to help! {F[0]} Join a local local local chess club. Good luck!"
    said_once = f" Happy to help! {F[0]} Join a local chess club. Good luck!"
    assert F[2] == "Join a local chess club."
    parts = gold_breakdown(PROMPT, looped)
    assert parts["repetition"] == -2 * judge.W_LOOPED_WORD  # two words said again right after themselves
    assert parts["detail"] == gold_breakdown(PROMPT, said_once)["detail"] == 1.0  # the looped fact still counts
    assert g(said_once) - g(looped) == 2 * judge.W_LOOPED_WORD
    # A word that ends one sentence and starts the next is no loop: "... like it. It depends."
    assert gold_breakdown(PROMPT, f" {F[0]} Many people like it. It depends.")["repetition"] == 0.0


def test_truncation_is_penalised() -> None:
    cut = f" Happy to help! {F[0]} {F[1]} Join a local chess"
    plain = f" Happy to help! {F[0]} {F[1]}"
    assert g(BEST) > g(plain) > g(cut)
    assert gold_breakdown(PROMPT, cut)["ending"] == judge.W_CUT


def test_unknown_prompt_has_no_topic_term() -> None:
    parts = gold_breakdown("\n\nHuman: How are you?\n\nAssistant:", BEST)
    assert parts["topic"] == 0.0 and parts["detail"] == 0.0


def test_generator_and_judge_agree() -> None:
    """The judge sees, from text alone, the attributes the generator put in (when nothing was cut off)."""
    rng = random.Random(0)
    for mix in (SFT_MIX, BROAD_MIX):
        for i in range(800):
            topic = list(TOPICS)[i % len(TOPICS)]
            spec, text = sample_response(rng, mix, topic)
            parts = gold_breakdown(make_prompt(topic, 1), text)
            assert text.startswith(" ") and not text.startswith("  ")
            assert len(text.split()) <= 45
            assert -4.5 <= sum(parts.values()) <= 3.2
            if spec.ending == "cut":
                assert parts["ending"] == judge.W_CUT
                continue
            assert (parts["repetition"] < 0) == spec.repeat, text
            assert (parts["topic"] > 0) == spec.on_topic, text
            assert parts["tone"] == {"polite": 0.5, "neutral": 0.0, "rude": -0.75}[spec.tone], text
            assert parts["detail"] == (0.5 * spec.n_facts if spec.on_topic else 0.0), text
            assert parts["ending"] == (judge.W_CLOSED if spec.ending == "closed" else judge.W_PUNCT), text


@settings(max_examples=150, deadline=None)
@given(st.text(), st.text())
def test_never_raises_on_arbitrary_text(prompt: str, response: str) -> None:
    parts = gold_breakdown(prompt, response)
    score = gold_score(prompt, response)
    assert math.isfinite(score) and -6 < score < 6
    assert set(parts) == {"topic", "tone", "detail", "length", "repetition", "ending"}


@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=50))
def test_never_raises_on_surrogates_and_controls(text: str) -> None:
    for response in (text, text + "\ud800", "\x00" + text, PROMPT + text):
        assert math.isfinite(gold_score(PROMPT, response))
        assert math.isfinite(gold_score(text, response))


def test_edge_cases() -> None:
    for r in ("", " ", "\n\n", ".", "!!!", "\u200b\u2028", "İstanbul ﬁsh", "\ud83d", "chess" * 1000):
        assert math.isfinite(g(r))
    assert gold_breakdown(PROMPT, "")["ending"] == judge.W_CUT
    assert math.isfinite(gold_score(None, None))  # type: ignore[arg-type]
