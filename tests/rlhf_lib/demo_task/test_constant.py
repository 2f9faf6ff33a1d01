"""The best constant reply: its candidates come from training templates only, and the pick is the scorer's best."""

from __future__ import annotations

from rlhf_lib.demo_task import gold_score, make_prompt
from rlhf_lib.demo_task.constant import best_constant, constant_candidates, fill
from rlhf_lib.demo_task.responses import HELDOUT_OPENERS


def test_candidates_are_distinct_training_templates() -> None:
    c = constant_candidates()
    assert len(c) == len(set(c)) == 1119
    assert all(t.startswith(" ") and not t.startswith("  ") for t in c)
    assert not any("Go slow" in t or any(o in t for o in HELDOUT_OPENERS) for t in c)
    assert " Happy to help! Learn the {k} basics first. Good luck!" in c


def test_fill_puts_the_prompt_topic_in() -> None:
    assert fill(" Join a local {k} club.", make_prompt("chess", 0)) == " Join a local chess club."
    assert fill(" Join a local {k} club.", "no topic here") == " Join a local it club."


def test_best_constant_is_the_scorers_argmax() -> None:
    prompts = [make_prompt("chess", 0), make_prompt("yoga", 2, 1)]
    calls = []

    def gold(ps: list[str], rs: list[str]) -> list[float]:
        calls.append(len(ps))
        return [gold_score(p, r) for p, r in zip(ps, rs)]

    template, mean = best_constant(gold, prompts)
    assert calls == [2 * 1119]  # one batch: every candidate on every prompt
    assert mean == 3.15  # the judge's maximum: polite, three facts, a closing phrase, inside the length window
    assert all(gold_score(p, fill(template, p)) == 3.15 for p in prompts)
    # Ties go to the first candidate; a scorer that prefers length picks the longest.
    first, _ = best_constant(lambda ps, rs: [0.0] * len(ps), prompts, [" A.", " B."])
    assert first == " A."
    longest, _ = best_constant(lambda ps, rs: [len(r) for r in rs], prompts)
    assert longest == max(constant_candidates(), key=len)
