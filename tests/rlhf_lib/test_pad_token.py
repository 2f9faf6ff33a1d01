"""A pretrained tokenizer without a PAD of its own (GPT-2, GPT-NeoX, Llama and Qwen2 ship none, or reuse EOS as
SmolLM2 does): `load_tokenizer` adds one beyond the checkpoint's vocabulary, and every stage's model must then have
an embedding row for it. One test per family: load, SFT steps, reward-model steps from the SFT model and from the
checkpoint, and batched sampling with padding."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.config import RewardConfig, SFTConfig
from rlhf_lib.data.records import RankedExample, SFTExample
from rlhf_lib.models import EOS_TOKEN, build_policy, build_reward_base, build_scalar_model, load_tokenizer
from rlhf_lib.reward import train_reward_model
from rlhf_lib.sft import train_sft

FAMILIES = ("gpt2", "gpt_neox", "llama", "qwen2")


def _config(family: str, vocab: int, eos: int):
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config

    ids = dict(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)  # pad == eos, as shipped
    return {
        "gpt2": lambda: GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64, **ids),
        "gpt_neox": lambda: GPTNeoXConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=32,
                                          intermediate_size=64, max_position_embeddings=64, **ids),
        "llama": lambda: LlamaConfig(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                     hidden_size=32, intermediate_size=64, max_position_embeddings=64,
                                     tie_word_embeddings=True, **ids),
        "qwen2": lambda: Qwen2Config(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                     hidden_size=32, intermediate_size=64, max_position_embeddings=64, **ids),
    }[family]()


@pytest.fixture(scope="module")
def no_pad_tokenizer():
    """A BPE tokenizer whose only special token is EOS, and no PAD (as GPT-2's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"\n\nHuman: how do I start hobby {i}?\n\nAssistant: Practise hobby {i} daily." for i in range(30)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=280, special_tokens=[EOS_TOKEN],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tokenizer_without_pad_trains_every_stage(family, no_pad_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    base = no_pad_tokenizer
    assert base.pad_token is None
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(_config(family, len(base), base.eos_token_id)).save_pretrained(tmp_path)
    base.save_pretrained(tmp_path)

    tok = load_tokenizer(tmp_path)
    assert tok.pad_token_id == len(base) and tok.pad_token_id != tok.eos_token_id  # a new id, past the vocabulary
    policy = build_policy(tok, str(tmp_path))
    rows = policy.get_input_embeddings().num_embeddings
    assert rows == len(tok) and tok.pad_token_id < rows and policy.config.pad_token_id == tok.pad_token_id

    sft = [SFTExample(f"\n\nHuman: how do I start hobby {i}?\n\nAssistant:", f" Practise hobby {i} daily.")
           for i in range(6)]
    final, _ = train_sft(policy, tok, sft, SFTConfig(epochs=1, batch_size=3, lr=1e-3, max_length=48))
    assert final["sft/steps"] == 2 and torch.isfinite(torch.tensor(final["sft/final_loss_ema"]))

    lists = [RankedExample(e.prompt, (e.response, " No idea.")) for e in sft]
    for rm in (build_scalar_model(policy), build_reward_base(str(tmp_path), tok)):
        assert rm.get_input_embeddings().num_embeddings >= len(tok) and rm.config.pad_token_id == tok.pad_token_id
        final, _ = train_reward_model(rm, tok, lists, RewardConfig(epochs=1, batch_size=3, lr=1e-3, max_length=48,
                                                                   max_steps=1))
        assert final["reward/steps"] == 1

    tok.padding_side = "left"
    batch = tok(["\n\nHuman: hi\n\nAssistant:", "\n\nHuman: how do I start hobby 3?\n\nAssistant:"],
                return_tensors="pt", padding=True)
    assert (batch["input_ids"] == tok.pad_token_id).any()
    out = policy.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    width = batch["input_ids"].shape[1]
    assert out.shape[0] == 2 and width < out.shape[1] <= width + 4


@pytest.mark.parametrize("stage", ["sft", "reward"])
def test_lora_trains_adapters_only_and_merges_them_before_saving(stage, tiny_tokenizer, tiny_policy, tmp_path):
    """`sft.lora` / `reward.lora`: only the adapters (and the RM's head) change during training; the model that
    comes back is a plain transformers model whose weights moved, and it saves and loads without peft."""
    from rlhf_lib.config import PipelineConfig

    examples = [SFTExample(f"\n\nHuman: tell me about topic {i}\n\nAssistant:", f" Sure, topic {i} is nice.")
                for i in range(6)]
    if stage == "sft":
        model = tiny_policy
        cfg = SFTConfig(epochs=1, batch_size=3, lr=1e-2, max_length=48, lora=True, lora_r=4)
        train = train_sft
    else:
        model = build_scalar_model(tiny_policy, seed=1)
        cfg = RewardConfig(epochs=1, batch_size=3, lr=1e-2, max_length=48, lora=True, lora_r=4)
        examples = [RankedExample(e.prompt, (e.response, " No.")) for e in examples]
        train = train_reward_model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, tiny_tokenizer, examples, cfg)
    after = model.state_dict()
    assert set(after) == set(before)  # no lora_A / lora_B / base_layer keys left: merged and unloaded
    assert not any(torch.equal(before[k], after[k]) for k in after if "attn.c_attn.weight" in k)  # merged in
    if stage == "reward":
        assert not torch.equal(before["score.weight"], after["score.weight"])  # the head trains whole
    model.save_pretrained(tmp_path)
    assert not (tmp_path / "adapter_config.json").exists()
    with pytest.raises(ValueError, match="sft.lora trains in one process"):
        PipelineConfig.model_validate({"sft": {"lora": True}, "resources": {"num_processes": 2}})
