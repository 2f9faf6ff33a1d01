"""The report's term-by-term table (stages/report.py): the paired difference's interval decides ahead / behind /
tie, so a difference whose interval spans 0 reads as a tie."""

from __future__ import annotations

from stages.report import terms_table

TERMS = ("topic", "detail", "tone", "length", "ending", "repetition")  # the demo judge's


def test_a_difference_whose_interval_spans_zero_is_a_tie():
    metrics = {"gold_topic_mean": 0.6, "gold_topic_mean_sft": 0.2, "gold_length_mean": -0.011,
               "gold_length_mean_sft": -0.012, "gold_tone_mean": 0.1, "gold_tone_mean_sft": 0.3}
    intervals = {"gold_topic_delta": [0.3, 0.5], "gold_length_delta": [-0.004, 0.006], "gold_tone_delta": [-0.3, -0.1]}
    rows = {r["term"]: r for r in terms_table(metrics, intervals, TERMS)}
    assert rows["topic"]["PPO vs SFT"] == "ahead" and rows["topic"]["PPO - SFT [95 %]"] == "0.4 [0.3, 0.5]"
    assert rows["length"]["PPO vs SFT"] == "tie"
    assert rows["tone"]["PPO vs SFT"] == "behind"
    assert terms_table(metrics, terms=TERMS)[0]["PPO vs SFT"] == ""  # no interval: no verdict
    assert terms_table(metrics) == []  # a task whose judge has no terms: no table
