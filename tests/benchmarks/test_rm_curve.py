"""benchmarks/rm_curve.py: the keys of each point and its table row (the runs themselves are a benchmark)."""

from __future__ import annotations

from benchmarks.rm_curve import markdown, point_sets, row
from flows.settings import load_config


def test_a_point_caps_training_rows_only_and_trains_one_epoch():
    sets = point_sets(640, 160)
    assert sets == ["data.max_train_rows=640", "data.max_rows=null", "reward.max_steps=null", "reward.epochs=1",
                    "reward.baseline_heldout_pairs=160"]
    cfg = load_config("smollm2-hh", None, sets)
    assert cfg.data.max_train_rows == 640 and cfg.data.max_rows is None and cfg.reward.max_steps is None
    assert cfg.data.eval_preferences  # the held-out file every point reads whole
    assert "reward.baseline_heldout_pairs=160" not in point_sets(640, None)


def test_a_row_shows_the_accuracy_and_each_baseline_with_the_rms_lead():
    got = {"accuracy": 0.61, "ci95": [0.55, 0.66], "baselines": {"shorter": 0.54, "ngram": None},
           "leads": {"shorter": 0.07, "ngram": None}, "steps": 40.0, "seconds": 600.0}
    r = row(320, got)
    assert r["RM accuracy, all held-out pairs [95 %]"] == "0.610 [0.550, 0.660]" and r["steps"] == 40
    assert r["RM on the baselines' pairs"] == "0.610"  # shorter's 0.540 + the RM's lead 0.070 there
    assert r["shorter (RM's lead)"] == "0.540 (+0.070)" and r["ngram (RM's lead)"] == "n/a"
    failed = row(160, {"error": "rlhf run reward failed: boom"})
    assert "boom" in failed["error"]
    assert markdown([r, failed]).count("\n") == 3
