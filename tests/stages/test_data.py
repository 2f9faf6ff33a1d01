"""The data stage's cache key follows the content of the user's files, not just their paths."""

from __future__ import annotations

import json

from rlhf_lib.config import PipelineConfig
from stages.cache import cache_key
from stages.data import data_identity

ROW = {"chosen": "\n\nHuman: hi\n\nAssistant: yes", "rejected": "\n\nHuman: hi\n\nAssistant: no"}


def user_fingerprint(cfg: PipelineConfig) -> str:
    return data_identity(cfg)[1]


def key_of(cfg: PipelineConfig) -> str:
    section, fingerprint = data_identity(cfg)
    return cache_key("data", section, {}, fingerprint)


def test_same_path_new_content_is_a_new_key(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    cfg = PipelineConfig.model_validate({"data": {"preferences": str(path)}})
    first = key_of(cfg)
    assert key_of(cfg) == first  # deterministic
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n")
    assert key_of(cfg) != first


def test_a_local_model_directory_is_part_of_the_fingerprint(tmp_path):
    # Its chat template renders conversational rows, so its files are part of the data's identity.
    (tmp_path / "prefs.jsonl").write_text(json.dumps(ROW) + "\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tokenizer_config.json").write_text("{}")
    cfg = PipelineConfig.model_validate({"data": {"preferences": str(tmp_path / "prefs.jsonl")},
                                         "model": {"name_or_path": str(tmp_path / "model")}})
    before = user_fingerprint(cfg)
    (tmp_path / "model" / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert user_fingerprint(cfg) != before


class FakeRun:
    """The part of a `StageRun` the data stage's build uses: artifact URI, metrics and tags."""

    artifact_uri = "file:///artifacts"

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics |= metrics

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags |= tags


def test_the_data_stage_builds_the_arithmetic_task(tmp_path, monkeypatch):
    from stages import data
    from rlhf_lib.data import read_prompts
    from rlhf_lib.demo_task import CONTRACT_FILES, FILE_NAMES

    calls, datasets, run = [], [], FakeRun()

    def run_stage(ctx, stage, inputs, build):
        calls.append((stage, dict(inputs.section), inputs.fingerprint))
        build(run, tmp_path, inputs, {})
        return "result", None

    monkeypatch.setattr(data, "run_stage", run_stage)
    monkeypatch.setattr(data, "as_state", lambda result: result)
    monkeypatch.setattr(data, "log_dataset", lambda run, rows, source, name, context, digest: datasets.append(name))
    cfg = PipelineConfig.model_validate({"data": {"task": "arithmetic", "n_train_prompts": 40, "n_eval_prompts": 8}})
    assert data.data_stage.fn(cfg, ctx=None) == "result"

    assert calls == [("data", {"data": cfg.data.key()}, "arithmetic")]  # no pretrained template: no model key
    assert run.tags == {"rlhf.data.rendering": "text"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(FILE_NAMES[k] for k in CONTRACT_FILES), "source.json"])
    info = data.source_info(tmp_path)
    assert (info["source"], info["judge"]) == ("arithmetic", None)
    assert info["reward"] == "rlhf_lib.rewards.builtin:exact_match"
    assert data.data_task(tmp_path).gold is None and data.dataset_name(tmp_path, "sft") == "arithmetic-sft"
    assert info["rows"] == {"sft": 80, "preferences": 40, "prompts_train": 40, "prompts_eval": 8, "eval_pairs": 16}
    assert run.metrics == {f"data/rows_{k}": v for k, v in info["rows"].items()}
    assert datasets == [f"arithmetic-{k}" for k in CONTRACT_FILES]
    assert all("answer" in p.columns for p in read_prompts(tmp_path / FILE_NAMES["prompts_eval"]).rows)
    assert 0.0 <= info["stats"]["sft_correct"] <= 1.0


def test_user_prompt_records_are_written_without_a_columns_field(tmp_path):
    # A prompt's columns are top-level fields of its row, as a user's file has them.
    from rlhf_lib.data import PromptExample, read_prompts, write_jsonl

    path = write_jsonl(tmp_path / "p.jsonl", [PromptExample("Q?"), PromptExample("R?", {"answer": "3"})])
    assert path.read_text() == '{"prompt": "Q?"}\n{"prompt": "R?", "answer": "3"}\n'
    assert read_prompts(path).rows == [PromptExample("Q?"), PromptExample("R?", {"answer": "3"})]
