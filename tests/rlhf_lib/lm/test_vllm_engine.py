"""Without vLLM installed, `ppo.rollout_engine: vllm` is refused when the config is read, naming the extra."""

from __future__ import annotations

import pytest

from rlhf_lib.config import ConfigError, PPOConfig, build_config
from rlhf_lib.config.ppo import require_engine, vllm_available
from rlhf_lib.lm.vllm_engine import VLLMRollout

needs_no_vllm = pytest.mark.skipif(vllm_available(), reason="vLLM is installed here: nothing to refuse")


@needs_no_vllm
def test_config_refuses_vllm_naming_the_key_and_the_extra(tmp_path):
    layer = tmp_path / "gpu.yaml"
    with pytest.raises(ConfigError) as err:
        build_config([(str(layer), {"ppo": {"rollout_engine": "vllm"}})])
    msg = str(err.value)
    assert f"{layer}: config key 'ppo.rollout_engine'" in msg
    assert "pip install 'rlhf-pipeline[vllm]'" in msg
    with pytest.raises(ConfigError, match=r"--set: config key 'ppo.rollout_engine'.*rlhf-pipeline\[vllm\]"):
        build_config([], ["ppo.rollout_engine=vllm"])


@needs_no_vllm
def test_engine_refuses_before_any_work(tiny_tokenizer, tiny_policy):
    with pytest.raises(ValueError, match=r"pip install 'rlhf-pipeline\[vllm\]'"):
        VLLMRollout(tiny_policy, tiny_tokenizer, max_new_tokens=4, temperature=1.0, seed=0)


def test_hf_engine_is_the_default_and_always_available():
    assert PPOConfig().rollout_engine == "hf"
    assert require_engine("hf") == "hf"
    with pytest.raises(ConfigError, match="ppo.rollout_engine"):
        build_config([], ["ppo.rollout_engine=sglang"])
