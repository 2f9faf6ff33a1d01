"""The data stage's cache key follows the content of the user's files, not just their paths."""

from __future__ import annotations

import json

from rlhf_lib.config import PipelineConfig
from stages.cache import cache_key
from stages.data import user_fingerprint

ROW = {"chosen": "\n\nHuman: hi\n\nAssistant: yes", "rejected": "\n\nHuman: hi\n\nAssistant: no"}


def key_of(cfg: PipelineConfig) -> str:
    return cache_key("data", cfg.data.model_dump(), {}, user_fingerprint(cfg))


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
