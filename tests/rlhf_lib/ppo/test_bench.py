from __future__ import annotations

import pytest

from rlhf_lib.models import count_parameters
from rlhf_lib.ppo.bench import BenchPPOConfig, build_models, make_prompts, ppo_config, summarize

TINY = dict(n_layer=1, n_head=2, n_embd=32, vocab_size=256, n_positions=32, prompt_length=8, response_length=4,
            rollout_batch_size=4, num_mini_batches=2, num_prompts=8)


def test_models_match_the_trl_baseline_sizes():
    # trl_ppo_baseline.py's README: policy and ref 3,438,080 parameters, value and reward 3,438,336.
    c = BenchPPOConfig()
    tokenizer, prompts = make_prompts(c)
    m = build_models(c, tokenizer)
    assert [count_parameters(x) for x in (m.policy, m.ref, m.value, m.reward)] == [3_438_080, 3_438_080,
                                                                                    3_438_336, 3_438_336]
    assert len(prompts) == 512
    assert all(len(tokenizer(p, add_special_tokens=False)["input_ids"]) >= 16 for p in prompts)


def test_eos_and_pad_can_never_be_sampled():
    # TRL's stop_token=None: nothing stops a response, so EOS and PAD sit just past the model's vocabulary.
    c = BenchPPOConfig(**TINY)
    tokenizer, _ = make_prompts(c)
    assert {tokenizer.eos_token_id, tokenizer.pad_token_id} == {c.vocab_size, c.vocab_size + 1}


def test_ppo_settings_follow_trl():
    p = ppo_config(BenchPPOConfig())
    assert (p.batch_size, p.max_new_tokens, p.epochs, p.minibatches, p.lr) == (64, 32, 1, 4, 3e-6)
    assert (p.adaptive_kl, p.kl_coef, p.kl_estimator, p.ent_coef, p.whiten_advantages) == (False, 0.05, "k1", 0, True)


def test_unknown_keys_are_refused():
    with pytest.raises(ValueError, match="no_such_key"):
        BenchPPOConfig(no_such_key=1)


def test_summary_by_hand():
    c = BenchPPOConfig(**TINY, warmup_iterations=1)
    row = dict(generate_s=0.1, rollout_score_s=0.2, update_s=0.5, other_s=0.0, cpu_s=1.0, foreign_cpu_s=0.0,
               peak_rss_mib=1.0)
    iters = [{**row, "total_s": 9.0}, {**row, "total_s": 0.8}, {**row, "total_s": 1.0}]  # the 9 s warm-up is left out
    s = summarize(c, iters, roofline_gflops=100.0)
    assert s["s_per_iter_median"] == 0.9 and s["measured_iterations"] == 2
    assert s["tokens_per_s_end_to_end"] == round(4 * 4 / 0.9, 1)  # 4 prompts x 4 tokens per iteration
    assert s["roofline_share"] == round(s["gflop_per_iter"] / 0.9 / 100.0, 3)
