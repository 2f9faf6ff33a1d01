"""User data end to end: 240 real HH-RLHF pairs through SFT -> RM -> PPO -> eval on the micro preset (a tokenizer
trained on them, no gold judge), a bad row that fails the data stage and caches nothing, and a pretrained local
policy with a chat template next to a reward model with its own tokenizer."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from mlflow import MlflowClient

from cli.main import load_config
from rlhf_lib.data import DataError
from rlhf_lib.data.conversations import RewardRendering, read_conversations

HH = Path(__file__).parents[1] / "fixtures" / "hh_rlhf" / "harmless-240.jsonl"
HH_SETS = [f"data.preferences={HH}", "data.on_bad_row=skip", "name=hh"]
STAGES = ["data", "sft", "reward", "ppo", "eval"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
RM_TEMPLATE = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")


@pytest.fixture(scope="module")
def hh_run(home):
    from flows.pipeline import rlhf

    return rlhf(config=load_config("micro", None, HH_SETS), pipeline="full")


def metrics(summary, stage):
    return MlflowClient().get_run(summary["stages"][stage]["mlflow_run_id"]).data


def test_rescoring_the_trained_rm_gives_its_stage_figures(hh_run):
    """`stages.reward_heldout.rescore` (rm_select --rescore) on the stage's own data: every held-out figure the reward
    stage logged, baselines included, to the last digit."""
    from rlhf_lib.devices import resolve_device
    from stages.artifact_cache import download
    from stages.reward_heldout import rescore

    def local(stage: str) -> Path:
        tags = metrics(hh_run, stage).tags
        return download(tags["rlhf.artifact_uri"], tags["rlhf.digest"])

    got, report, html = rescore(load_config("micro", None, HH_SETS), local("data"), local("sft"), local("reward"),
                                resolve_device("cpu"))
    logged = metrics(hh_run, "reward").metrics
    assert {"reward/heldout_accuracy", "reward/baseline/probe_accuracy", "reward/baseline/loglik_accuracy"} <= set(got)
    assert {k: logged[k] for k in got} == pytest.approx(got, abs=1e-9)
    assert report["accuracy"] == got["reward/heldout_accuracy"] and "<html" in html.lower()


def test_hh_pairs_run_sft_rm_ppo_eval_without_a_judge(hh_run):
    from stages.artifact_cache import download
    from stages.models_io import load_policy

    assert {k: v["status"] for k, v in hh_run["stages"].items()} == {s: "ran" for s in STAGES}
    ev = hh_run["eval"]
    assert ev["win_rate_vs_sft"] is None and ev["gold_reward_mean"] is None and ev["gold_reward_mean_sft"] is None
    assert 0.0 <= ev["rm_win_rate_vs_sft"] <= 1.0 and 0.0 <= ev["reward_model_accuracy"] <= 1.0
    assert math.isfinite(ev["kl_to_ref"]) and math.isfinite(ev["reward_mean"]) and ev["truncated_prompts"] > 0
    data = metrics(hh_run, "data")
    assert data.metrics["data/skipped_preferences"] == 1 and data.metrics["data/skipped_preferences/empty_reply"] == 1
    assert data.metrics["data/rows_eval_pairs"] == 24 and data.tags["rlhf.data.preferences_format"] == "hh"
    # HH prompts are long: the micro model's 64 positions cut them on the left, and the stages say how often.
    assert metrics(hh_run, "sft").metrics["sft/truncated_prompts"] > 0
    assert metrics(hh_run, "reward").metrics["reward/truncated_prompts"] > 0
    assert metrics(hh_run, "ppo").metrics["ppo/truncated_prompts"] > 0
    # The tokenizer was trained on the HH texts: with 320 tokens, the transcript markers are one token each.
    _, tok = load_policy(hh_run["stages"]["sft"]["model_uri"])
    assert [len(tok(w, add_special_tokens=False)["input_ids"]) for w in ("Human", "Assistant")] == [1, 1]
    report = download(f"runs:/{hh_run['stages']['eval']['mlflow_run_id']}/report")
    assert "n/a: no gold judge" in (report / "report.html").read_text()
    assert json.loads((report / "report.json").read_text())["lineage"]["data"] == "harmless-240"


def test_a_bad_row_fails_the_data_stage_and_caches_nothing(hh_run):
    from flows.pipeline import rlhf

    client = MlflowClient()
    versions = len(client.search_model_versions("name = 'rlhf-sft'"))
    for _ in range(2):  # the second attempt fails the same way: a failed run is never a cache hit
        with pytest.raises(DataError, match=r"harmless-240.jsonl:69: field 'chosen'"):
            rlhf(config=load_config("micro", None, [f"data.preferences={HH}", "name=hh-strict"]), pipeline="sft")
    exp = client.get_experiment_by_name("rlhf").experiment_id
    runs = client.search_runs([exp], "tags.`rlhf.stage` = 'data'", order_by=["attributes.start_time DESC"])
    assert [r.info.status for r in runs[:2]] == ["FAILED", "FAILED"]
    assert all("rlhf.cache_key" not in r.data.tags for r in runs[:2])
    assert len(client.search_model_versions("name = 'rlhf-sft'")) == versions


def _local_model(path: Path, corpus: list[str], vocab: int, template: str | None = None) -> Path:
    """A tiny GPT-2 and its tokenizer saved with save_pretrained: a stand-in for a hub checkpoint."""
    from rlhf_lib.models import build_policy, train_tokenizer

    tok = train_tokenizer(corpus, vocab)
    if template:
        tok.chat_template = template
    build_policy(tok, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_local_policy_with_chat_template_and_reward_model_with_its_own_tokenizer(hh_run, tmp_path):
    from flows.pipeline import rlhf
    from rlhf_lib.models import load_tokenizer, same_tokenizer
    from stages.artifact_cache import download

    def turn(role, content):
        return {"role": role, "content": content}

    rows = [{"chosen": [turn("user", f"Tips for hobby {i}?"), turn("assistant", f"Practise hobby {i} daily.")],
             "rejected": [turn("user", f"Tips for hobby {i}?"), turn("assistant", "No idea, go away.")]}
            for i in range(40)]
    prefs = tmp_path / "conv.jsonl"
    prefs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = [m["content"] for r in rows for m in r["chosen"] + r["rejected"]] + ["<|user|><|assistant|>"]
    policy_dir = _local_model(tmp_path / "policy", corpus, 300, TEMPLATE)
    rm_dir = _local_model(tmp_path / "rm", [t.upper() + " and more words" for t in corpus] + ["[USER] [ASSISTANT]"],
                          280, RM_TEMPLATE)
    sets = [f"data.preferences={prefs}", f"model.name_or_path={policy_dir}", f"reward.name_or_path={rm_dir}",
            "name=conv", "data.eval_fraction=0.2"]
    out = rlhf(config=load_config("micro", None, sets), pipeline="full")
    assert {k: v["status"] for k, v in out["stages"].items()} == {s: "ran" for s in STAGES}
    data = metrics(out, "data")
    assert data.tags["rlhf.data.rendering"] == "chat_template"
    assert data.tags["rlhf.data.preferences_format"] == "conversational"
    data_dir = download(f"runs:/{out['stages']['data']['mlflow_run_id']}/data")
    prompt = json.loads((data_dir / "prompts_eval.jsonl").read_text().splitlines()[0])["prompt"]
    assert prompt.startswith("<|user|>Tips for hobby") and prompt.endswith("<|assistant|>")
    policy_tok, rm_tok = load_tokenizer(download(out["stages"]["sft"]["model_uri"])), load_tokenizer(
        download(out["stages"]["reward"]["model_uri"]))
    assert policy_tok.chat_template == TEMPLATE and not same_tokenizer(policy_tok, rm_tok)
    assert rm_tok.get_vocab() == load_tokenizer(rm_dir).get_vocab()
    name, version = out["stages"]["reward"]["model_uri"].removeprefix("models:/").split("/")
    assert "rlhf.upstream.sft" not in MlflowClient().get_model_version(name, version).tags  # not from SFT
    ppo = metrics(out, "ppo").metrics
    assert math.isfinite(ppo["objective/score"]) and math.isfinite(out["eval"]["reward_mean"])
    # The RM read every prompt through its own template: in training, in its held-out report and in PPO's scoring.
    assert metrics(out, "reward").tags["rlhf.reward.rendering"] == "own chat template"
    assert re.fullmatch(r"own chat template: [1-9]\d* prompts, 0 scored as the policy's text",
                        metrics(out, "ppo").tags["rlhf.reward.rendering"])
    table = read_conversations(data_dir / "conversations.jsonl")
    assert table[prompt] == [turn("user", prompt.removeprefix("<|user|>").removesuffix("\n<|assistant|>"))]
    rendering = RewardRendering(table, rm_tok, "auto", policy_tok)
    assert rendering.prompt(prompt) == f"[USER] {table[prompt][0]['content']}\n[ASSISTANT] "
