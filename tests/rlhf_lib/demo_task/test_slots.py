"""Slots of the demo task: prompt format, topic parsing, and the train/eval split of (topic, ask) combinations."""

from __future__ import annotations

from rlhf_lib.demo_task import (
    ASKS,
    TONES,
    TOPIC_NAMES,
    TOPICS,
    held_out_combos,
    make_prompt,
    parse_topic,
    prompt_slots,
    prompts_for,
    train_combos,
)
from rlhf_lib.demo_task.slots import words


def test_prompt_is_hh_format() -> None:
    p = make_prompt("chess", 1, 2)
    assert p.startswith("\n\nHuman: ") and p.endswith("\n\nAssistant:")
    assert "chess" in p


def test_split_is_disjoint_and_covers_every_combination() -> None:
    held, train = held_out_combos(), train_combos()
    assert not held & train
    assert len(held | train) == len(TOPIC_NAMES) * len(ASKS)
    assert 0.15 <= len(held) / (len(held) + len(train)) <= 0.3


def test_every_topic_and_ask_is_seen_in_training() -> None:
    train = train_combos()
    assert {t for t, _ in train} == set(TOPIC_NAMES)
    assert {a for _, a in train} == set(range(len(ASKS)))


def test_prompts_for_is_ordered_and_complete() -> None:
    prompts = prompts_for(held_out_combos())
    assert prompts == prompts_for(held_out_combos())
    assert len(prompts) == len(set(prompts)) == len(held_out_combos()) * len(TONES)


def test_parse_topic_round_trips_every_prompt() -> None:
    for t in TOPIC_NAMES:
        for a in range(len(ASKS)):
            for k in range(len(TONES)):
                p = make_prompt(t, a, k)
                assert parse_topic(p) == t
                assert prompt_slots(p) == (t, a, k)


def test_parse_topic_uses_the_last_human_turn() -> None:
    p = "\n\nHuman: Any tips about yoga?\n\nAssistant: Sure, chess.\n\nHuman: And about fishing?\n\nAssistant:"
    assert parse_topic(p) == "fishing"
    assert parse_topic("\n\nHuman: What is the weather?\n\nAssistant:") is None
    assert parse_topic("") is None
    assert prompt_slots("not a prompt") is None


def test_keywords_are_distinctive() -> None:
    for t, facts in TOPICS.items():
        assert len(set(facts)) == len(facts) >= 4
        for fact in facts:
            mentioned = set(words(fact)) & set(TOPIC_NAMES)
            assert mentioned == {t}, fact
    for ask in ASKS + TONES:
        assert not set(words(ask)) & set(TOPIC_NAMES)
