"""Pretrained models from a local directory (save_pretrained), trust_remote_code only on request, and a reward
model from its own base checkpoint and tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from rlhf_lib.models import build_policy, build_reward_base, hub_kwargs, load_tokenizer, train_tokenizer

CONFIG_PY = """from transformers import GPT2Config


class TinyConfig(GPT2Config):
    model_type = "tiny-custom"
"""
MODELING_PY = """from transformers import GPT2LMHeadModel

from .configuration_tiny import TinyConfig


class TinyLM(GPT2LMHeadModel):
    config_class = TinyConfig
"""


@pytest.fixture()
def saved_gpt2(tiny_tokenizer, tmp_path):
    """A tiny GPT-2 saved with dropout on, and a tokenizer without a PAD token: what a hub checkpoint looks like."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer.backend_tokenizer, eos_token="<|endoftext|>")
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=2, resid_pdrop=0.1,
                     embd_pdrop=0.1, attn_pdrop=0.1)
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    tok.save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_a_local_directory_loads_through_from_pretrained(saved_gpt2):
    from transformers import GPT2LMHeadModel

    tok = load_tokenizer(saved_gpt2)
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id  # added: PAD must differ from EOS
    model = build_policy(tok, str(saved_gpt2))
    reference = GPT2LMHeadModel.from_pretrained(saved_gpt2)
    assert model.get_input_embeddings().num_embeddings == len(tok)  # resized for the new PAD token
    assert torch.equal(model.transformer.h[0].attn.c_attn.weight, reference.transformer.h[0].attn.c_attn.weight)
    assert model.config.pad_token_id == tok.pad_token_id
    # Dropout is off in the modules themselves (set in the config before they are built), even in train mode.
    drops = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(p == 0.0 for p in drops)


def test_trust_remote_code_is_passed_only_when_asked(saved_gpt2):
    cfg = json.loads((saved_gpt2 / "config.json").read_text())
    cfg.update(model_type="tiny-custom", auto_map={"AutoConfig": "configuration_tiny.TinyConfig",
                                                   "AutoModelForCausalLM": "modeling_tiny.TinyLM"})
    (saved_gpt2 / "config.json").write_text(json.dumps(cfg))
    (saved_gpt2 / "configuration_tiny.py").write_text(CONFIG_PY)
    (saved_gpt2 / "modeling_tiny.py").write_text(MODELING_PY)
    tok = load_tokenizer(saved_gpt2)
    assert hub_kwargs() == {} and hub_kwargs("v1", True) == {"revision": "v1", "trust_remote_code": True}
    with pytest.raises(ValueError, match="trust_remote_code"):
        build_policy(tok, str(saved_gpt2))  # the default never runs the checkpoint's code
    model = build_policy(tok, str(saved_gpt2), trust_remote_code=True)
    assert type(model).__name__ == "TinyLM"


def test_reward_base_has_its_own_tokenizer_and_a_neutral_head(saved_gpt2):
    tok = load_tokenizer(saved_gpt2)
    rm = build_reward_base(str(saved_gpt2), tok, seed=0)
    ids = torch.tensor([tok("hello there", add_special_tokens=False)["input_ids"]])
    assert rm.config.num_labels == 1 and rm.config.pad_token_id == tok.pad_token_id
    with torch.no_grad():
        assert float(rm(input_ids=ids).logits.abs().max()) == 0.0  # untrained RM: every score is 0


def test_a_tokenizer_without_eos_is_refused(tmp_path):
    from transformers import PreTrainedTokenizerFast

    bare = train_tokenizer(["a b c"] * 4, vocab_size=270).backend_tokenizer
    PreTrainedTokenizerFast(tokenizer_object=bare).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no EOS token"):
        load_tokenizer(tmp_path)


def test_a_normal_head_has_the_n_plus_scale_and_a_backbone_gradient_from_step_one(tiny_policy, tiny_tokenizer):
    from rlhf_lib.models import build_scalar_model, init_score_head

    zero = build_scalar_model(tiny_policy, seed=3)
    normal = build_scalar_model(tiny_policy, seed=3, head_init="normal")
    again = build_scalar_model(tiny_policy, seed=3, head_init="normal")
    w = normal.score.weight.detach()
    assert w.shape == (1, 32) and torch.equal(w, again.score.weight)  # seeded
    # N(0, 1/(d+1)) with d = 32: 32 draws; their mean square is 1/33 within a wide band (chi-square, 32 dof)
    assert 0.4 / 33 < float(w.pow(2).mean()) < 1.8 / 33
    ids = torch.tensor([tiny_tokenizer("a b c", add_special_tokens=False)["input_ids"]])
    grads = {}
    for name, model in (("zero", zero), ("normal", normal)):
        model.train()
        model(input_ids=ids).logits.sum().backward()
        grads[name] = sum(float(p.grad.abs().sum()) for n, p in model.named_parameters()
                          if p.grad is not None and not n.startswith("score"))
    assert grads["zero"] == 0.0 and grads["normal"] > 0.0  # a zero head passes no gradient to the backbone
    with pytest.raises(ValueError, match="head_init"):
        init_score_head(zero, "xavier")
