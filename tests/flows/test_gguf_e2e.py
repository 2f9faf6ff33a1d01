"""A pretrained model given as a GGUF file, end to end on the micro preset: a tiny Llama written with the `gguf`
package (PAD == EOS in its tokenizer, a ChatML template), 240 real HH pairs rendered through that template, every
stage trained from the imported folder, and the lineage from the SFT run back to the file's sha256."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from cli.main import load_config
from rlhf_lib.model_import import sha256_file
from tests.rlhf_lib.gguf_writer import write_tiny_llama_gguf

HH = Path(__file__).parents[1] / "fixtures" / "hh_rlhf" / "harmless-240.jsonl"


@pytest.fixture(scope="module")
def gguf_run(home, tmp_path_factory):
    from flows.pipeline import rlhf

    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_tiny_llama_gguf(path)
    sets = [f"data.preferences={HH}", "data.on_bad_row=skip", "data.max_rows=60", "name=gguf",
            f"model.name_or_path={path}", "sft.lr=1e-4", "reward.lr=1e-4", "ppo.lr=1e-5", "ppo.value_lr=1e-5",
            "ppo.logprob_chunk=8", "eval.max_prompts=4"]
    return path, rlhf(config=load_config("micro", None, sets), pipeline="full")


def test_a_gguf_policy_runs_every_stage_through_its_chat_template(gguf_run):
    from rlhf_lib.models import load_tokenizer
    from stages.artifact_cache import download

    path, out = gguf_run
    assert {k: v["status"] for k, v in out["stages"].items()} == dict.fromkeys(
        ("data", "sft", "reward", "ppo", "eval"), "ran")
    client = MlflowClient()
    data = client.get_run(out["stages"]["data"]["mlflow_run_id"]).data
    assert data.tags["rlhf.data.rendering"] == "chat_template" and data.tags["rlhf.data.preferences_format"] == "hh"
    assert data.metrics["data/rows_preferences"] <= 60
    data_dir = download(f"runs:/{out['stages']['data']['mlflow_run_id']}/data")
    row = json.loads((data_dir / "preferences.jsonl").read_text().splitlines()[0])
    assert row["prompt"].startswith("<|im_start|>user\n") and row["prompt"].endswith("<|im_start|>assistant\n")
    assert "\n\nHuman:" not in row["prompt"] and not row["responses"][0].startswith(" ")
    # The PAD that load_tokenizer added (the file's PAD is its EOS) is a real row of the trained policy.
    policy_dir = download(out["stages"]["ppo"]["model_uri"])
    tok = load_tokenizer(policy_dir)
    config = json.loads((policy_dir / "config.json").read_text())
    assert tok.pad_token_id != tok.eos_token_id and tok.pad_token_id < config["vocab_size"] == len(tok)
    assert tok.eos_token == "<|im_end|>"  # the end of a ChatML turn stops sampling and takes the reward


def test_the_sft_run_names_the_gguf_file_and_its_import_run(gguf_run):
    path, out = gguf_run
    client = MlflowClient()
    tags = client.get_run(out["stages"]["sft"]["mlflow_run_id"]).data.tags
    assert tags["rlhf.base_model"] == str(path) and tags["rlhf.base_model.kind"] == "gguf"
    assert tags["rlhf.base_model.sha256"] == sha256_file(path)
    imported = client.get_run(tags["rlhf.base_model.import_run"])
    assert imported.data.tags["rlhf.stage"] == "import" and imported.data.tags["rlhf.import.sha256"] == sha256_file(path)
    assert imported.data.params["architecture"] == "llama"


def test_a_changed_gguf_file_is_a_new_cache_key(gguf_run, tmp_path):
    from stages.models_io import model_source_digest

    path, _ = gguf_run
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(path.read_bytes())
    assert model_source_digest(str(copy)) == model_source_digest(str(path)) == f"gguf:{sha256_file(path)}"
    write_tiny_llama_gguf(copy, seed=1)
    assert model_source_digest(str(copy)) != model_source_digest(str(path))
