from __future__ import annotations

from benchmarks.flops import Shape, causal_keys, forward_flops, generate_flops, ppo_iteration_flops

# One layer, d = 2, MLP f = 8 (4 d), vocabulary 3.
S = Shape(n_layer=1, d=2, vocab=3)
# Per token: projections 2 * (4*2*2 + 2*2*8) = 2 * (16 + 32) = 96; attention per visible key: 4 * 2 = 8;
# LM head per projected token: 2 * 2 * 3 = 12.


def test_causal_keys_counts_visible_keys():
    assert causal_keys(3) == 1 + 2 + 3
    assert causal_keys(2, past=4) == 5 + 6


def test_forward_by_hand():
    # 1 row of 2 tokens, head on 1 position: 2 * 96 + 8 * (1 + 2) + 12 = 192 + 24 + 12
    assert forward_flops(S, batch=1, length=2, head_positions=1) == 228
    assert forward_flops(S, batch=3, length=2, head_positions=1) == 3 * 228


def test_generate_by_hand():
    # prompt 2, 3 new tokens: prefill 2 * 96 + 8 * 3 = 216; 2 decode steps 2 * 96 + 8 * (3 + 4) = 248;
    # LM head for 3 sampled tokens 3 * 12 = 36.
    assert generate_flops(S, batch=1, prompt=2, new=3) == 216 + 248 + 36


def test_ppo_iteration_phases_by_hand():
    # batch 1, prompt 2, new 1, T = 3.  ref: 3 * 96 + 8 * 6 + 12 * 1 = 348; value and reward: 288 + 48 = 336 each.
    f = ppo_iteration_flops(S, S, S, batch=1, prompt=2, new=1, epochs=2)
    assert f["generate"] == 2 * 96 + 8 * 3 + 12
    assert f["score"] == 348 + 336 + 336
    assert f["update"] == 2 * 3 * (348 + 336)  # 2 epochs x (forward + backward = 3 forwards) x (policy + value)
    assert f["total"] == f["generate"] + f["score"] + f["update"]


def test_gpt2_small_is_about_6n_per_token():
    # Sanity of the rules: GPT-2 124M body (85M non-embedding params) costs ~2 * 85M FLOPs per token forward.
    g = Shape(n_layer=12, d=768, vocab=50257)
    per_token = forward_flops(g, batch=1, length=1, head_positions=0)
    assert abs(per_token - 2 * 85_000_000) / (2 * 85_000_000) < 0.01
