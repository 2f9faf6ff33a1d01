"""What a deployment run may read (issue 55): data and models under the host's roots, MLflow model URIs, known
model names, hub ids only while the hub is on; never `..`, `~`, URLs, a datasets builder name or a path outside the
roots. The refusal is one line naming each key. Presets are names, never paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.path_policy import PROJECT_DATA, check_deployment_paths, host_roots, hub_is_on, refusal, requests
from rlhf_lib.config import ConfigError, PipelineConfig


def _cfg(**sections) -> PipelineConfig:
    return PipelineConfig.model_validate(sections)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_every_key_that_names_something_to_read_is_found():
    cfg = _cfg(data={"sft": "text", "preferences": "data/x.jsonl"}, model={"name_or_path": "/srv/m"},
               reward={"name_or_path": "smollm2"},
               ppo={"rewards": [{"name": "rm", "kind": "model", "model": "models:/rlhf-reward/1"},
                                {"name": "j", "kind": "judge", "model": "smollm2", "template": "{prompt}{response}"}]},
               eval={"judge": {"name": "g", "kind": "model", "model": "/tmp/rm"}},
               resources={"accelerate_config": "../x.yaml"})
    assert list(requests(cfg, "file:///m", None)) == [
        ("data.preferences", "data/x.jsonl", "data"), ("data.sft", "text", "data"),
        ("model.name_or_path", "/srv/m", "model"), ("reward.name_or_path", "smollm2", "model"),
        ("ppo.rewards[0].model", "models:/rlhf-reward/1", "uri"), ("ppo.rewards[1].model", "smollm2", "model"),
        ("eval.judge.model", "/tmp/rm", "uri"), ("sft_model", "file:///m", "uri"),
        ("resources.accelerate_config", "../x.yaml", "config")]
    assert list(requests(PipelineConfig())) == []


@pytest.mark.parametrize("value, what, why", [
    ("text", "data", "datasets builder name"), ("JSON", "data", "datasets builder name"),
    ("/etc/ssh/ssh_config", "data", "outside the folders"), ("/etc", "model", "outside the folders"),
    ("data/../../etc/passwd", "data", "'..'"), ("~/.aws/credentials", "data", "'~'"),
    ("file:///etc/passwd", "uri", "URLs"), ("s3://bucket/x", "model", "URLs"), ("/tmp/rm", "uri", "outside"),
    ("models:/rlhf-reward/1", "data", "not a data source"), ("Anthropic/hh-rlhf", "data", "hub is off"),
    ("openai-community/gpt2", "model", "hub is off"), ("../accelerate.yaml", "config", "'..'"),
    ("/etc/x.yaml", "config", "outside"),
])
def test_what_a_deployment_run_may_not_read(value, what, why, tmp_path):
    assert why in refusal(value, what, host_roots(tmp_path), hub=False)


@pytest.mark.parametrize("value, what", [
    ("models:/rlhf-reward@champion", "uri"), ("runs:/abc/model", "model"), ("smollm2", "model"),
    (str(PROJECT_DATA / "hh-harmless" / "train.jsonl"), "data"), ("data/hh-harmless/train.jsonl", "data"),
    ("cpu_gloo.yaml", "config"),
])
def test_what_it_may_read(value, what, tmp_path, monkeypatch):
    monkeypatch.chdir(PROJECT_DATA.parent)
    assert refusal(value, what, host_roots(tmp_path), hub=False) is None


def test_a_hub_id_only_while_the_hub_is_on(tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    assert hub_is_on()
    assert refusal("Anthropic/hh-rlhf", "data", host_roots(tmp_path), hub=True) is None
    assert "builder" in refusal("text", "data", host_roots(tmp_path), hub=True)  # never a hub id
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert not hub_is_on()


def test_the_host_adds_roots_in_its_environment_and_file(tmp_path, monkeypatch):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for d in (mine, theirs):
        d.mkdir()
        (d / "x.jsonl").write_text("{}\n")
    (tmp_path / "allow-paths.txt").write_text(f"{mine}  # my data\n")
    assert refusal(str(mine / "x.jsonl"), "data", host_roots(tmp_path), hub=False) is None
    assert refusal(str(theirs / "x.jsonl"), "data", host_roots(tmp_path), hub=False)
    monkeypatch.setenv("RLHF_ALLOW_PATHS", str(theirs))
    assert refusal(str(theirs / "x.jsonl"), "data", host_roots(tmp_path), hub=False) is None
    assert (tmp_path / "imported").resolve() in host_roots(tmp_path)


def test_a_symlink_out_of_a_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "allow-paths.txt").write_text(f"{root}\n")
    (root / "link.jsonl").symlink_to("/etc/hostname")
    assert "outside" in refusal(str(root / "link.jsonl"), "data", host_roots(tmp_path), hub=False)


def test_the_refusal_is_one_line_naming_every_key(tmp_path, offline):
    cfg = _cfg(data={"preferences": "json", "sft": "text", "prompts": "text", "hub_data_dir": "/etc/ssh"})
    with pytest.raises(ConfigError) as e:
        check_deployment_paths(cfg, tmp_path, sft_model="/srv/models/x")
    message = str(e.value)
    assert "\n" not in message and "allow-paths.txt" in message
    for key in ("data.sft='text'", "data.prompts='text'", "data.hub_data_dir='/etc/ssh'", "sft_model='/srv/models/x'"):
        assert key in message, message
    check_deployment_paths(PipelineConfig(), tmp_path)  # the demo task reads nothing from outside


def test_presets_are_names_never_paths(tmp_path):
    from flows.settings import preset_layer

    (tmp_path / "secret.yaml").write_text("api_key: hunter2\n")
    for name in (str(tmp_path / "secret"), "../../../" + str(tmp_path / "secret"), "micro/../micro", "/etc/x"):
        with pytest.raises(ConfigError, match="unknown preset") as e:
            preset_layer(name)
        assert "hunter2" not in str(e.value) and "api_key" not in str(e.value)
    assert preset_layer("micro")[0] == "preset micro"


def test_a_builder_name_is_never_read_as_a_hub_data_set(tmp_path, monkeypatch):
    """`data.sft=text` with `data.hub_data_dir=<folder>` read every file of the folder through datasets' text
    builder, on any run: now the source is a missing file."""
    from rlhf_lib.data.fields import DataError
    from rlhf_lib.data.sources import PACKAGED_BUILDERS, Source, is_builder_name

    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "creds").write_text("aws_secret_access_key = x\n")
    with pytest.raises(DataError, match="datasets builder name is not a hub data set"):
        Source("text", data_dir=str(tmp_path / "secret")).kind
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES  # the private list this relies on, pinned

    assert {"text", "json", "csv", "parquet"} <= set(_PACKAGED_DATASETS_MODULES)
    assert set(_PACKAGED_DATASETS_MODULES) <= PACKAGED_BUILDERS | {n for n in _PACKAGED_DATASETS_MODULES
                                                                   if is_builder_name(n)}
    assert Source("Anthropic/hh-rlhf").kind == "hub"


def test_the_operations_page_holds_the_policy_table_generated_from_the_policies():
    from flows.code_policy import GATED
    from flows.policy_docs import policy_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert policy_table() in page, "docs/operations.md is out of date: paste `python -m flows.policy_docs` into it"
    for key, _, _ in GATED:
        assert f"| `{key}` |" in page
    assert "| `eval.judge.function` |" in page and "| `ppo.environment` |" in page


def test_every_key_requests_finds_is_in_the_table():
    from flows.path_policy import READ_KEYS

    cfg = _cfg(data={"preferences": "a.jsonl", "sft": "b.jsonl", "prompts": "c.jsonl", "eval_preferences": "d.jsonl",
                     "eval_prompts": "e.jsonl"}, model={"name_or_path": "m"}, reward={"name_or_path": "r"},
               ppo={"rewards": [{"name": "rm", "kind": "model", "model": "models:/x/1"}]},
               eval={"judge": {"name": "g", "kind": "model", "model": "models:/y/1"}},
               resources={"accelerate_config": "cpu_gloo.yaml"})
    listed = " ".join(key for key, _ in READ_KEYS)
    for key, _, _ in requests(cfg, "models:/a/1", "models:/b/1"):
        assert key.split("[")[0] in listed.replace("[]", ""), key


def test_a_module_wildcard_allows_only_what_the_module_defines():
    from flows.code_policy import ALWAYS, is_allowed

    allowed = set(ALWAYS)
    assert is_allowed("function:rlhf_lib.rewards.builtin:exact_match", allowed)
    for imported in ("re", "Sequence", "Any", "nope"):  # names the module imported, or none at all
        assert not is_allowed(f"function:rlhf_lib.rewards.builtin:{imported}", allowed)
    env = {"environment:rlhf_lib.envs.calculator:*"}
    assert is_allowed("environment:rlhf_lib.envs.calculator:CalculatorEnv", env)
    assert not is_allowed("environment:rlhf_lib.envs.calculator:Step", env)  # imported from envs.base
    assert not is_allowed("function:no.such.module:f", {"function:no.such.module:*"})


def test_a_content_digest_reads_regular_files_only_and_refuses_a_huge_folder(tmp_path):
    import os

    from stages.manifest import dir_digest

    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    before = dir_digest(tmp_path)
    os.mkfifo(tmp_path / "pipe")  # reading it would block forever
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert dir_digest(tmp_path) == before
    with pytest.raises(ValueError, match="over the 0 GiB a content digest reads"):
        dir_digest(tmp_path, max_bytes=99)
