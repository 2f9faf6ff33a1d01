"""The PPO benchmark's setup on the TRL baseline's configuration, and its summary arithmetic."""

from __future__ import annotations

import pytest

from benchmarks.config import PRESET_DIRS, BenchPipelineConfig
from benchmarks.ppo import build_models, make_prompts, summarize
from flows.settings import load_config
from rlhf_lib.config import ConfigError
from rlhf_lib.models import count_parameters

TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.vocab_size=256", "model.n_positions=32",
        "bench.prompt_length=8", "ppo.max_new_tokens=4", "ppo.batch_size=4", "ppo.minibatches=2",
        "bench.num_prompts=8", "eval.max_new_tokens=4"]


def _config(sets=()) -> BenchPipelineConfig:
    return load_config("trl-baseline", None, list(sets), BenchPipelineConfig, PRESET_DIRS)


def test_models_match_the_trl_baseline_sizes():
    # trl_ppo_baseline.py's README: policy and ref 3,438,080 parameters, value and reward 3,438,336.
    c = _config()
    tokenizer, prompts = make_prompts(c)
    m = build_models(c, tokenizer)
    assert [count_parameters(x) for x in (m.policy, m.ref, m.value, m.reward)] == [3_438_080, 3_438_080,
                                                                                    3_438_336, 3_438_336]
    assert len(prompts) == 512
    assert all(len(tokenizer(p, add_special_tokens=False)["input_ids"]) >= 16 for p in prompts)


@pytest.mark.parametrize("vocab", [256, 2048])
def test_eos_and_pad_can_never_be_sampled(vocab):
    # TRL's stop_token=None: nothing stops a response, so EOS and PAD sit just past the model's vocabulary, also
    # past the 1024 tokens the synthetic corpus yields (GPT-2's 50,257 in benchmarks/gpu_check.py).
    c = _config([*TINY, f"model.vocab_size={vocab}"])
    tokenizer, prompts = make_prompts(c)
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (vocab, vocab + 1)
    assert max(max(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts) < min(vocab, 1024)


def test_ppo_settings_follow_trl():
    p = _config().ppo
    assert (p.batch_size, p.max_new_tokens, p.epochs, p.minibatches, p.lr) == (64, 32, 1, 4, 3e-6)
    assert (p.adaptive_kl, p.kl_coef, p.kl_estimator, p.ent_coef, p.whiten_advantages) == (False, 0.05, "k1", 0, True)
    assert (p.stop_at_eos, p.rm_offset_samples, p.max_grad_norm) == (False, 0, 1e9)


def test_unknown_keys_are_refused_naming_them():
    with pytest.raises(ConfigError, match="bench.no_such_key"):
        _config(["bench.no_such_key=1"])
    with pytest.raises(ConfigError, match="bench.iterations"):
        _config(["bench.iterations=many"])


def test_summary_by_hand():
    c = _config([*TINY, "bench.warmup_iterations=1"])
    row = dict(generate_s=0.1, rollout_score_s=0.2, update_s=0.5, cpu_s=1.0, foreign_cpu_s=0.0, peak_rss_mib=1.0)
    iters = [{**row, "total_s": 9.0}, {**row, "total_s": 0.8}, {**row, "total_s": 1.0}]  # the 9 s warm-up is left out
    s = summarize(c, iters, roofline_gflops=100.0)
    assert s["s_per_iter_median"] == 0.9 and s["measured_iterations"] == 2
    assert s["tokens_per_s_end_to_end"] == round(4 * 4 / 0.9, 1)  # 4 prompts x 4 tokens per iteration
    assert s["roofline_share"] == round(s["gflop_per_iter"] / 0.9 / 100.0, 3)
    assert s["other_s_median"] == 0.1  # (0.8 - 0.8 + 1.0 - 0.8) / 2: what the phases do not account for
