"""Slots of the demo task: prompt format, topic parsing, and the train / validation / test split."""

from __future__ import annotations

from rlhf_lib.demo_task import (
    ASKS,
    TEST_TOPICS,
    TONES,
    TOPIC_NAMES,
    TOPICS,
    VAL_TOPICS,
    facts_of,
    held_out_combos,
    make_prompt,
    parse_topic,
    prompt_slots,
    prompts_for,
    split_combos,
    topics_of,
    train_combos,
)
from rlhf_lib.demo_task.slots import words


def test_prompt_is_hh_format() -> None:
    p = make_prompt("chess", 1, 2)
    assert p.startswith("\n\nHuman: ") and p.endswith("\n\nAssistant:")
    assert "chess" in p


def test_split_is_disjoint_and_covers_every_combination() -> None:
    train, val, test = (split_combos(k) for k in ("train", "validation", "test"))
    assert not train & val and not train & test and not val & test
    assert len(train | val | test) == len(TOPIC_NAMES) * len(ASKS)
    assert held_out_combos() == val | test
    assert 0.3 <= len(held_out_combos()) / len(TOPIC_NAMES) / len(ASKS) <= 0.5


def test_held_out_topics_are_whole_and_never_in_training() -> None:
    train, val, test = (split_combos(k) for k in ("train", "validation", "test"))
    assert not set(TEST_TOPICS) & set(VAL_TOPICS)
    for topics, combos in ((TEST_TOPICS, test), (VAL_TOPICS, val)):
        assert {(t, a) for t in topics for a in range(len(ASKS))} <= combos
    assert not {t for t, _ in train} & set(TEST_TOPICS + VAL_TOPICS)
    assert not set(topics_of("train")) & set(TEST_TOPICS + VAL_TOPICS)
    assert set(topics_of("test")) == set(TOPIC_NAMES)
    # Both held-out splits also hold new asks of training topics, so they test wording as well as topics.
    assert {t for t, _ in test} - set(TEST_TOPICS) and {t for t, _ in val} - set(VAL_TOPICS)


def test_every_training_topic_keeps_most_asks_and_every_ask_is_trained() -> None:
    train = train_combos()
    for topic in {t for t, _ in train}:
        assert sum(t == topic for t, _ in train) >= 4
    assert {a for _, a in train} == set(range(len(ASKS)))


def test_one_fact_template_is_held_out_of_training() -> None:
    assert len(facts_of("chess", "train")) == len(TOPICS["chess"]) - 1
    assert facts_of("chess", "test") == facts_of("chess", "validation") == TOPICS["chess"]
    assert "Go slow with chess at first." not in facts_of("chess", "train")


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
