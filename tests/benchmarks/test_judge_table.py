"""benchmarks/judge_table.py's logic alone: which `rlhf` runs it asks for (the judge's own keys and the pinned models go
where they belong), and the prompt and table formatting. The runs themselves are real pipelines, exercised by the
flow tests; here `rlhf` is replaced by a recorder and the script stops before reading MLflow."""

from __future__ import annotations

import pytest

from benchmarks import judge_table


class Stop(Exception):
    pass


def record(calls: list[list[str]]):
    def rlhf(args, home, log):
        calls.append(args)
        if len(calls) == 2:
            raise Stop  # after both runs are asked for; MLflow is not read
        return {"stages": {"reward": {"mlflow_run_id": "J1"}}}, 1.0

    return rlhf


def test_the_judge_gets_its_own_keys_and_the_full_run_the_pinned_models(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(judge_table, "rlhf", record(calls))
    with pytest.raises(Stop):
        judge_table.main(["--skip", "640", "--set", "a=1", "--judge-set", "reward.name_or_path=smollm2",
                          "--sft-model", "runs:/S/model", "--reward-model", "runs:/R/model"])
    judge, full = calls
    assert judge[:2] == ["run", "reward"] and "data.skip_rows=640" in judge and "name=judge" in judge
    assert "reward.name_or_path=smollm2" in judge and "reward.name_or_path=smollm2" not in full
    assert "a=1" in judge and "a=1" in full
    assert judge[judge.index("--sft-model") + 1] == "runs:/S/model" == full[full.index("--sft-model") + 1]
    assert "--reward-model" not in judge and full[full.index("--reward-model") + 1] == "runs:/R/model"
    assert full[:2] == ["run", "full"] and "eval.best_of=[4,16]" in full
    assert 'eval.judge={name: judge, kind: model, model: "runs:/J1/model"}' in full
    assert not any(a.startswith("data.skip_rows") for a in full)


def test_without_pinned_models_both_stages_run():
    calls: list[list[str]] = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(judge_table, "rlhf", record(calls))
        with pytest.raises(Stop):
            judge_table.main([])
    assert all("--sft-model" not in c and "--reward-model" not in c for c in calls)


def test_a_judge_trained_before_is_not_trained_again(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(judge_table, "rlhf", record(calls))
    calls.append(["(slot)"])  # the recorder stops at its second call: here the full run
    with pytest.raises(Stop):
        judge_table.main(["--judge-run", "J0"])
    assert calls[1][:2] == ["run", "full"]
    assert 'eval.judge={name: judge, kind: model, model: "runs:/J0/model"}' in calls[1]


def test_last_turn_reads_chatml_and_hh_transcripts():
    chatml = ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n"
              "How do I   pick a lock?<|im_end|>\n<|im_start|>assistant\n")
    assert judge_table.last_turn(chatml) == "How do I pick a lock?"
    assert judge_table.last_turn("\n\nHuman: a\n\nAssistant: b\n\nHuman: why?\n\nAssistant:") == "why?"
    assert judge_table.last_turn("x" * 10, width=4) == "xxxx..."


def test_markdown_table_rounds_floats_and_escapes_bars():
    text = judge_table.markdown([{"policy": "a|b", "kl": 0.123456}, {"policy": "c", "kl": 2.0}])
    assert text.splitlines() == ["| policy | kl |", "| --- | --- |", "| a/b | 0.1235 |", "| c | 2 |"]
