from __future__ import annotations

import torch

from rlhf_lib.lm.generation import _draw, decode_responses, encode_prompts, ends_with_eos, preallocated_cache, sample
from rlhf_lib.lm.scoring import concat, position_ids, response_logprobs

PROMPTS = ["\n\nHuman: tell me about topic 3\n\nAssistant:", "\n\nHuman: hi\n\nAssistant:"]


def test_prompts_are_left_padded(tiny_tokenizer):
    q, m = encode_prompts(tiny_tokenizer, PROMPTS, max_prompt_tokens=64)
    short = len(tiny_tokenizer(PROMPTS[1], add_special_tokens=False)["input_ids"])
    assert m[1].tolist() == [0] * (q.shape[1] - short) + [1] * short
    assert (q[1, : q.shape[1] - short] == tiny_tokenizer.pad_token_id).all()


def _sample(policy, tok, temperature=0.7, max_new_tokens=12, seed=0, **kw):
    q, m = encode_prompts(tok, PROMPTS * 4, 64)
    r, rm, lp = sample(policy, q, m, max_new_tokens=max_new_tokens, temperature=temperature,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       generator=torch.Generator().manual_seed(seed), **kw)
    return q, m, r, rm, lp


def test_sampling_logprobs_equal_a_plain_forward_at_the_same_temperature(tiny_tokenizer, tiny_policy):
    for temperature in (0.7, 1.3):
        q, m, r, rm, lp = _sample(tiny_policy, tiny_tokenizer, temperature)
        with torch.no_grad():
            again, _ = response_logprobs(tiny_policy, q, m, r, rm, temperature)
        torch.testing.assert_close(lp * rm, again, atol=1e-5, rtol=1e-5)


def test_fast_path_logprobs_equal_a_plain_full_forward(tiny_tokenizer, tiny_policy):
    # The sampling loop (KV cache preallocated, LM head on the last position only) against one forward over the
    # whole left-padded sequence with every position projected and no cache: log-probs must agree.
    for stop_at_eos in (True, False):
        q, m, r, rm, lp = _sample(tiny_policy, tiny_tokenizer, 0.7, max_new_tokens=10, stop_at_eos=stop_at_eos)
        ids, mask = concat(q, m, r, rm)
        with torch.no_grad():
            logits = tiny_policy(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        p = q.shape[1]
        full = torch.log_softmax(logits[:, p - 1 : -1].float() / 0.7, -1).gather(-1, r.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(lp, full * rm, atol=1e-5, rtol=1e-5)


def test_preallocated_cache_gives_the_logits_of_the_growing_cache(tiny_tokenizer, tiny_policy):
    from transformers import DynamicCache

    q, m = encode_prompts(tiny_tokenizer, PROMPTS, 64)
    steps = torch.randint(0, len(tiny_tokenizer), (q.shape[0], 3), generator=torch.Generator().manual_seed(0))
    fast = preallocated_cache(tiny_policy, q.shape[1] + 3)
    assert {type(layer).__name__ for layer in fast.layers} == {"PreallocatedLayer"}
    outs = []
    for kv in (fast, DynamicCache(config=tiny_policy.config)):
        attn, logits = m, []
        with torch.no_grad():
            out = tiny_policy(input_ids=q, attention_mask=attn, position_ids=position_ids(attn), cache=kv,
                              use_cache=True)
            for t in range(3):
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
                out = tiny_policy(input_ids=steps[:, t : t + 1], attention_mask=attn,
                                  position_ids=position_ids(attn)[:, -1:], cache=out.cache, use_cache=True)
                logits.append(out.logits[:, -1])
        outs.append(torch.stack(logits))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-6)


def test_inverse_cdf_draw_by_hand():
    # p = [0.2, 0, 0.5, 0.3] -> cdf [0.2, 0.2, 0.7, 1.0]; token = first index whose cdf exceeds u.
    logp = torch.tensor([0.2, 0.0, 0.5, 0.3]).log().expand(5, 4)
    u = torch.tensor([0.1, 0.2, 0.25, 0.7, 0.99])
    assert _draw(logp, u).tolist() == [0, 2, 2, 3, 3]  # never 1, the token of probability 0


def test_inverse_cdf_draw_follows_the_distribution():
    p = torch.softmax(torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5]), -1)
    n = 40_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(_draw(p.log().expand(n, 5), u), minlength=5).float() / n
    torch.testing.assert_close(counts, p, atol=0.01, rtol=0)  # ~4 standard errors at n = 40k


def test_after_eos_everything_is_padding(tiny_tokenizer, tiny_policy):
    eos = tiny_tokenizer.eos_token_id
    # Make EOS likely so that some rows stop early.
    with torch.no_grad():
        tiny_policy.lm_head.weight[eos] += 0.5 * tiny_policy.transformer.wte.weight.abs().mean()
        tiny_policy.transformer.wte.weight[eos] *= 1.0
    q, m, r, rm, lp = _sample(tiny_policy, tiny_tokenizer, temperature=2.0, max_new_tokens=16)
    for row, mask, logp in zip(r.tolist(), rm.tolist(), lp.tolist()):
        if eos in row:
            end = row.index(eos)
            assert mask == [1] * (end + 1) + [0] * (len(row) - end - 1)  # EOS itself is a real token
            assert all(t == tiny_tokenizer.pad_token_id for t in row[end + 1 :])
            assert all(v == 0.0 for v in logp[end + 1 :])
        else:
            assert mask == [1] * len(row)
    assert ends_with_eos(r, rm, eos).tolist() == [eos in row for row in r.tolist()]


def test_stop_at_eos_off_runs_full_length(tiny_tokenizer, tiny_policy):
    _, _, r, rm, _ = _sample(tiny_policy, tiny_tokenizer, max_new_tokens=7, stop_at_eos=False)
    assert r.shape[1] == 7 and bool(rm.all())


def test_same_generator_seed_same_samples(tiny_tokenizer, tiny_policy):
    a = _sample(tiny_policy, tiny_tokenizer, seed=3)[2]
    b = _sample(tiny_policy, tiny_tokenizer, seed=3)[2]
    assert torch.equal(a, b)


def test_decode_drops_eos_and_padding(tiny_tokenizer):
    ids = tiny_tokenizer(" Sure", add_special_tokens=False)["input_ids"]
    r = torch.tensor([ids + [tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id]])
    m = torch.tensor([[1] * (len(ids) + 1) + [0]])
    assert decode_responses(tiny_tokenizer, r, m) == [" Sure"]
