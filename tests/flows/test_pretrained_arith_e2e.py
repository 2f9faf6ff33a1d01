"""End to end: the arithmetic task on a pretrained local policy with a chat template (the `smollm2-arith` preset at
micro sizes): the rows rendered through the template, RL from the pretrained model itself (`sft.max_steps: 0`: the
SFT stage registers its weights unchanged), the reward stage skipped, the exact match read from the last integer."""

from __future__ import annotations

import json

import pytest
import torch
from mlflow import MlflowClient

from cli.main import load_config

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MICRO = ["data.n_train_prompts=48", "data.n_eval_prompts=8", "model.n_positions=64", "ppo.iterations=2",
         "ppo.batch_size=8", "ppo.minibatches=2", "ppo.max_new_tokens=8", "ppo.sample_every=1", "eval.max_new_tokens=8",
         "eval.best_of=[2]", "eval.best_of_prompts=4", "eval.samples_in_report=4", "resources.mixed_precision=no",
         "resources.frozen_dtype=float32"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny GPT-2 with a chat template, saved with save_pretrained: a stand-in for a hub checkpoint."""
    from rlhf_lib.models import build_policy, train_tokenizer

    path = tmp_path_factory.mktemp("pretrained")
    corpus = [f"What is {a} + {b}? {a} + {b} = {a + b}" for a in range(10, 100, 7) for b in range(1, 10)]
    tok = train_tokenizer(corpus + ["<|user|><|assistant|>"], 200, split_digits=True)
    tok.chat_template = TEMPLATE
    build_policy(tok, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_rl_from_a_pretrained_chat_model_on_the_arithmetic_task(home, pretrained):
    from flows.pipeline import rlhf
    from stages.artifact_cache import download

    out = rlhf(config=load_config("smollm2-arith", None, [f"model.name_or_path={pretrained}", *MICRO]),
               pipeline="full")
    assert {k: v["status"] for k, v in out["stages"].items()} == {
        "data": "ran", "sft": "ran", "reward": "skipped", "ppo": "ran", "ppo-zero_reward": "ran", "eval": "ran"}
    # The preset's zero-reward control: the exact-match reward replaced by 0, compared prompt by prompt.
    assert out["eval"]["reward_lead_over_zero_reward"] is not None
    client = MlflowClient()
    data_run = client.get_run(out["stages"]["data"]["mlflow_run_id"])
    assert data_run.data.tags["rlhf.data.rendering"] == "chat_template"
    data_dir = download(f"runs:/{data_run.info.run_id}/data")
    rows = [json.loads(line) for line in (data_dir / "prompts_eval.jsonl").read_text().splitlines()]
    told = "? Answer with the number only.\n<|assistant|>"  # the preset's data.instruction after the question
    assert all(r["prompt"].startswith("<|user|>What is ") and r["prompt"].endswith(told) for r in rows)
    problems = [r["prompt"].removeprefix("<|user|>What is ").split("?")[0].split(" + ") for r in rows]
    assert all(int(a) < 10 and int(b) < 10 for a, b in problems)  # 1+1 operands
    # sft.max_steps 0: the registered SFT model is the pretrained one, weight for weight.
    assert client.get_run(out["stages"]["sft"]["mlflow_run_id"]).data.metrics["sft/steps"] == 0.0
    from transformers import AutoModelForCausalLM

    sft = AutoModelForCausalLM.from_pretrained(download(out["stages"]["sft"]["model_uri"])).state_dict()
    base = AutoModelForCausalLM.from_pretrained(pretrained).state_dict()
    assert sft.keys() == base.keys() and all(torch.equal(sft[k], base[k]) for k in base)
    assert 0.0 <= out["eval"]["reward_mean"] <= 1.0
    ppo = client.get_run(out["stages"]["ppo"]["mlflow_run_id"]).data
    assert 0.0 <= ppo.metrics["objective/score_raw"] <= 1.0


def test_no_sft_needs_a_pretrained_model():
    from rlhf_lib.config import ConfigError

    with pytest.raises(ConfigError, match="sft.max_steps=0 keeps the base model untrained"):
        load_config("arithmetic", None, ["sft.max_steps=0"])
