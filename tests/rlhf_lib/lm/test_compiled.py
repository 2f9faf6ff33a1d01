"""`ppo.rollout_engine: compiled`: the compiled decode step on a static cache draws the eager sampler's tokens under
one seed, in float32, with log-probs within 1e-5; each shape compiles once, and in-place weight updates (an optimizer
step) are read without a recompile. Tiny random GPT-2 and Llama models (the two position schemes)."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.lm.compiled import CompiledDecoder
from rlhf_lib.lm.generation import sample

EOS, PAD = 2, 0


def tiny(kind: str):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                           bos_token_id=1, eos_token_id=EOS))
    else:
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                             bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD))
    return model.eval()


def queries(b: int = 3, p: int = 11):
    g = torch.Generator().manual_seed(5)
    q = torch.randint(3, 64, (b, p), generator=g)
    m = torch.ones_like(q)
    q[0, :4], m[0, :4] = PAD, 0  # a shorter prompt, left-padded
    return q, m


def both(model, decoder, q, m, seed=1, **kw):
    args = dict(max_new_tokens=12, temperature=0.9, eos_token_id=EOS, pad_token_id=PAD, **kw)
    eager = sample(model, q, m, generator=torch.Generator().manual_seed(seed), **args)
    compiled = sample(model, q, m, generator=torch.Generator().manual_seed(seed), decoder=decoder, **args)
    return eager, compiled


def assert_same(eager, compiled):
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    assert torch.allclose(eager[2], compiled[2], atol=1e-5)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_compiled_decoder_draws_the_eager_tokens_and_compiles_each_shape_once(kind):
    model, dec = tiny(kind), CompiledDecoder(bucket=8)
    q, m = queries()
    eager, compiled = both(model, dec, q, m, stop_at_eos=False)
    assert_same(eager, compiled)
    assert dec.prompt_width(11) == 16 and dec.compiles == 1 and dec.compile_seconds > 0
    # another seed, the same shapes: no new graph; EOS stops (the common token 7 as EOS) end the loop early as eager
    assert_same(*both(model, dec, q, m, seed=2))
    again = both(model, dec, q, m, seed=3, stop_at_eos=True)
    assert_same(*again) and dec.compiles == 1
    # an optimizer step updates the weights in place: the graph reads them as inputs, no recompile
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    assert_same(*both(model, dec, q, m, seed=4, stop_at_eos=False)) and dec.compiles == 1
    if kind == "llama":  # the graph bookkeeping below does not depend on the model: once (GPT-2) is enough
        return
    # a prompt width in the same bucket reuses the graph; another batch size is a new one
    assert_same(*both(model, dec, q[:, 2:], m[:, 2:], stop_at_eos=False)) and dec.compiles == 1
    assert_same(*both(model, dec, q[:2], m[:2], stop_at_eos=False)) and dec.compiles == 2
    # at most two graphs (and caches) are kept: a third shape drops the oldest, which compiles again if it comes back
    assert_same(*both(model, dec, q[:1], m[:1], stop_at_eos=False)) and dec.compiles == 3 and len(dec.graphs) == 2
    assert_same(*both(model, dec, q, m, stop_at_eos=False)) and dec.compiles == 4 and len(dec.graphs) == 2


def test_a_bucket_must_be_positive():
    with pytest.raises(ValueError, match="bucket"):
        CompiledDecoder(bucket=0)
