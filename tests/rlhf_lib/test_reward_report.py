"""The reward-model report on hand-made scores."""

from __future__ import annotations

import pytest

from rlhf_lib.data.records import PairExample
from rlhf_lib.reward_report import adversarial_metrics, adversarial_report, rm_report


def test_accuracy_margin_bins_terms_categories_and_mistakes():
    pairs = [PairExample("p", f"good {i}", f"bad {i}", "chat" if i < 4 else "safety") for i in range(8)]
    # Right on 6 of 8; the two mistakes are rows 1 (margin 0.1) and 6 (margin 2, the most confident one).
    chosen = [1.0, 0.0, 3.0, 2.0, 5.0, 1.0, 0.0, 4.0]
    rejected = [0.5, 0.1, 1.0, 0.0, 0.0, 0.0, 2.0, 3.5]
    terms = {"good 0": {"topic": 1, "tone": 0}}

    def judge_terms(prompt: str, response: str) -> dict[str, float]:
        return terms.get(response, {"topic": 0, "tone": 0})  # only pair 0 differs, in the topic term

    rep = rm_report(pairs, chosen, rejected, judge_terms, bins=2)
    assert rep["pairs"] == 8 and rep["accuracy"] == 0.75
    lo, hi = rep["ci95"]
    assert lo < 0.75 < hi
    # |margins| 0.5 0.1 2 2 5 1 2 0.5: the lower half (0.1-1) holds rows 0 1 5 7 (3 right), the upper 2 3 4 6 (3 right)
    assert [(b["pairs"], b["accuracy"]) for b in rep["by_margin"]] == [(4, 0.75), (4, 0.75)]
    assert {t["term"]: (t["pairs"], t["accuracy"]) for t in rep["by_term"]}["topic"] == (1, 1.0)
    assert {c["category"]: c["accuracy"] for c in rep["by_category"]} == {"chat": 0.75, "safety": 0.75}
    assert [m["chosen"] for m in rep["mistakes"]] == ["good 6", "good 1"]  # most confident first
    assert rep["scores"]["chosen"]["mean"] == pytest.approx(2.0)


def test_no_categories_no_terms():
    rep = rm_report([PairExample("p", "a", "b")] * 3, [1.0, 1.0, 1.0], [0.0, 2.0, 1.0])
    assert rep["accuracy"] == pytest.approx(1 / 3)  # a tie counts as wrong
    assert "by_term" not in rep and "by_category" not in rep
    assert len(rep["mistakes"]) == 2


def test_adversarial_report_by_kind_and_topic_pair() -> None:
    cats = ["loop", "loop", "cut", "topic:yoga>chess", "topic:yoga>chess", "topic:chess>yoga", "topic:chess>yoga",
            "topic:chess>yoga", "topic:chess>yoga", "topic:chess>yoga"]
    right = [True, False, True, True, False, True, True, True, True, False]
    pairs = [PairExample("p", "a", "b", c) for c in cats]
    rep = adversarial_report(pairs, right, floor=0.8, worst=1)
    assert rep["pairs"] == 10 and rep["accuracy"] == 0.7
    assert [(k["kind"], k["pairs"], k["accuracy"]) for k in rep["by_kind"]] == [
        ("loop", 2, 0.5), ("cut", 1, 1.0), ("topic", 7, 5 / 7)]
    assert [(t["topic_pair"], t["accuracy"]) for t in rep["topic_pairs"]] == [("yoga vs chess", 0.5),
                                                                             ("chess vs yoga", 0.8)]
    assert rep["weak_topic_pairs"] == 1  # 0.8 is not under the floor
    assert rep["worst_topic_pairs"] == rep["topic_pairs"][:1]
    metrics = adversarial_metrics(rep)
    assert metrics == {"reward/adversarial_accuracy": 0.7, "reward/adversarial/loop_accuracy": 0.5,
                       "reward/adversarial/cut_accuracy": 1.0, "reward/adversarial/topic_accuracy": 5 / 7,
                       "reward/adversarial/worst_topic_pair_accuracy": 0.5, "reward/adversarial/weak_topic_pairs": 1.0}


def test_adversarial_report_without_topic_pairs() -> None:
    rep = adversarial_report([PairExample("p", "a", "b", "cut")], [False])
    assert rep["topic_pairs"] == [] and rep["weak_topic_pairs"] == 0
    assert adversarial_metrics(rep) == {"reward/adversarial_accuracy": 0.0, "reward/adversarial/cut_accuracy": 0.0}
