"""One redaction for everything that leaves the process (rlhf_lib/redaction.py)."""

from __future__ import annotations

import logging

import pytest

from rlhf_lib.config import PipelineConfig
from rlhf_lib.redaction import redact, redact_logs, redact_text, redact_tree

KEY = "Zq8s1Plant3dKey"


@pytest.mark.parametrize(("text", "want"), [
    (f"https://judge/score?api_key={KEY}&n=1", "https://judge/score?api_key=***&n=1"),
    (f"https://judge/score?n=1&token={KEY}", "https://judge/score?n=1&token=***"),
    (f"https://s3.example/b/o?X-Amz-Signature={KEY}&sig={KEY}", "https://s3.example/b/o?X-Amz-Signature=***&sig=***"),
    (f"http://user:{KEY}@db:5432/x", "http://***@db:5432/x"),
    (f"Authorization: Bearer {KEY}", "Authorization: Bearer ***"),
    ("hf_" + "a" * 30 + " and sk-" + "b" * 24, "*** and ***"),
    ("max_new_tokens=48 tokenizer=gpt2 key_cache=2", "max_new_tokens=48 tokenizer=gpt2 key_cache=2"),
    ("https://judge/score?monkey=1&keyboard=2", "https://judge/score?monkey=1&keyboard=2"),
])
def test_redact_text(text, want):
    assert redact_text(text) == want
    assert redact_text(want) == want  # idempotent


def test_keys_and_trees():
    assert redact("hub_token", "x") == "***" and redact("ppo.max_new_tokens", 12) == "12"
    tree = {"password": "p", "url": f"https://h/?key={KEY}", "n": 3, "list": [f"Bearer {KEY}"], "token_env": "T"}
    assert redact_tree(tree) == {"password": "***", "url": "https://h/?key=***", "n": 3, "list": ["Bearer ***"],
                                 "token_env": "***"}
    assert redact_tree(tree, by_key=False)["token_env"] == "T"


def test_a_config_dumps_to_json_redacted_and_to_python_whole():
    cfg = PipelineConfig.model_validate({"ppo": {"rewards": [
        {"name": "rm", "kind": "model"},
        {"name": "judge", "kind": "http", "url": f"https://judge/score?api_key={KEY}", "token_env": "JUDGE_TOKEN"}]}})
    assert KEY not in cfg.model_dump_json() and KEY not in str(cfg.model_dump(mode="json"))
    dumped = cfg.model_dump(mode="json")["ppo"]["rewards"][1]
    assert dumped["url"] == "https://judge/score?api_key=***" and dumped["token_env"] == "JUDGE_TOKEN"
    assert cfg.model_dump()["ppo"]["rewards"][1]["url"].endswith(KEY)  # the run itself still has it
    assert KEY not in cfg.ppo.rewards[1].describe()

    from fastapi.encoders import jsonable_encoder  # what Prefect stores as a flow run's parameters

    assert KEY not in str(jsonable_encoder(cfg))


def test_log_records_are_redacted_whatever_the_handler(caplog):
    redact_logs()
    redact_logs()  # idempotent
    with caplog.at_level(logging.INFO):
        logging.getLogger("some.lib").info("calling %s now", f"https://x/?api_key={KEY}")
    assert KEY not in caplog.text and "api_key=***" in caplog.text


def test_the_http_client_reads_url_variables_and_never_shows_them(monkeypatch):
    from rlhf_lib.rewards import RewardError, TextBatch
    from rlhf_lib.rewards.http import HttpReward

    reward = HttpReward("judge", "http://127.0.0.1:9/score?api_key=${JUDGE_KEY}", retries=1, timeout_s=2)
    batch = TextBatch(["p"], ["c"], [True])
    with pytest.raises(RewardError, match=r"environment variable JUDGE_KEY \(in the url\) is not set"):
        reward(batch)
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with pytest.raises(RewardError) as info:  # nothing listens on port 9
        reward(batch)
    assert KEY not in str(info.value) and KEY not in repr(reward)
    literal = HttpReward("judge", f"http://127.0.0.1:9/score?api_key={KEY}", retries=1, timeout_s=2)
    with pytest.raises(RewardError) as info:
        literal(batch)
    assert KEY not in str(info.value) and "api_key=***" in str(info.value) and KEY not in repr(literal)


def test_variable_references_survive_and_the_jobs_own_dump_keeps_secrets():
    from rlhf_lib.config.base import KEEP_SECRETS

    assert redact_text("https://j/s?api_key=${JUDGE_KEY}&token=abc") == "https://j/s?api_key=${JUDGE_KEY}&token=***"
    cfg = PipelineConfig.model_validate({"ppo": {"rewards": [
        {"name": "rm", "kind": "model"},
        {"name": "judge", "kind": "http", "url": f"https://judge/score?api_key={KEY}"}]}})
    kept = cfg.model_dump(mode="json", context={KEEP_SECRETS: True})
    assert kept["ppo"]["rewards"][1]["url"].endswith(KEY)  # what PPO's job file holds: the run needs the key
    assert PipelineConfig.model_validate(kept) == cfg
