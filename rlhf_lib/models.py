"""Builders for the tokenizer and the four models of RLHF-PPO.

GPT-2 is the fresh-model family: it is the architecture of the TRL PPO baseline we benchmark against (same
random-init scheme, same shapes), it has learned absolute positions (no RoPE cache to rebuild per length), and
`GPT2ForSequenceClassification` is the standard reward/value model class (`.score` head on the backbone) that
TRL, OpenRLHF and users' own reward models use. Any other causal LM loads through `name_or_path`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model classes are slow to import: each builder imports what it uses
    from transformers import GPT2Config, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int, split_digits: bool = False) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts`, with a PAD token distinct from EOS.

    PAD != EOS matters for PPO: with pad == eos, masking padding also masks the EOS the policy emitted, and the
    model never learns to stop (N+ implementation details, "EOS trick").

    `split_digits`: every digit is a token of its own, as in the Llama and Qwen tokenizers. BPE would otherwise
    merge frequent numbers ("48") into single tokens and leave rare ones in pieces, so the same digit in the same
    column would be a different token from problem to problem; one token per digit lets a small model learn
    arithmetic column by column.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, bos_token=EOS_TOKEN)
    fast.padding_side = "right"
    return fast


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Whether token ids mean the same to both: same vocabulary (added tokens included) and special ids."""
    specials = ("eos_token_id", "pad_token_id", "bos_token_id")
    return a.get_vocab() == b.get_vocab() and all(getattr(a, s) == getattr(b, s) for s in specials)


def hub_kwargs(revision: str | None = None, trust_remote_code: bool = False) -> dict[str, object]:
    """Keyword arguments of `from_pretrained`: `trust_remote_code` only when asked for (it runs the checkpoint's own
    Python code), `revision` only when pinned."""
    kw: dict[str, object] = {"revision": revision} if revision else {}
    if trust_remote_code:
        kw["trust_remote_code"] = trust_remote_code
    return kw


def load_tokenizer(name_or_path: str | Path, revision: str | None = None,
                   trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load a tokenizer and make sure it has a PAD token distinct from EOS (and an EOS at all)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(name_or_path), **hub_kwargs(revision, trust_remote_code))
    if tok.eos_token is None:
        raise ValueError(f"{name_or_path}: the tokenizer has no EOS token; responses could never end")
    if tok.pad_token is None or tok.pad_token_id == tok.eos_token_id:
        tok.add_special_tokens({"pad_token": PAD_TOKEN})
    return tok


def load_pretrained(name_or_path: str | Path, auto_class: str, tokenizer: PreTrainedTokenizerBase,
                    revision: str | None = None, trust_remote_code: bool = False,
                    dtype: torch.dtype | str = torch.float32, **config_kw) -> PreTrainedModel:
    """`transformers.<auto_class>.from_pretrained` without dropout, with embeddings for every token of `tokenizer`
    and its PAD id, its weights in `dtype` whatever dtype the checkpoint was saved in ("auto": the saved one).
    Dropout goes off in the config before the model is built: its modules read it only then.

    The dtype is explicit because transformers 5 loads a checkpoint in its saved dtype by default: a bf16 hub model
    would train in pure bf16 with Adam's moments in bf16, where PPO's small steps round away (model.dtype)."""
    import transformers

    kw = hub_kwargs(revision, trust_remote_code)
    config = transformers.AutoConfig.from_pretrained(str(name_or_path), **kw, **config_kw)
    _no_dropout(config)
    pad = tokenizer.pad_token_id
    # A PAD that `load_tokenizer` added (Llama, GPT-2, GPT-NeoX and Qwen2 tokenizers have none of their own, or
    # reuse EOS) is beyond the checkpoint's vocabulary: the embedding is built with the saved rows and only then
    # grown to cover it, so the config may name it only after the resize (an embedding's padding_idx must be one
    # of its rows).
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    config.pad_token_id = pad if vocab is None or pad < vocab else None
    model = getattr(transformers, auto_class).from_pretrained(str(name_or_path), config=config, dtype=dtype, **kw)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        # The new rows start at the mean of the trained ones (transformers' mean_resizing): a PAD input then
        # looks like an average token rather than noise; it is masked out of attention and loss anyway.
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = pad
    return model


def _no_dropout(config) -> None:
    # Dropout makes log-probs of the same tokens differ between rollout and update, which biases the PPO ratio
    # (N+ implementation details: "disable dropout"). All four models run without it.
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout", "dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)


def gpt2_config(
    tokenizer: PreTrainedTokenizerBase, n_layer: int, n_head: int, n_embd: int, n_positions: int
) -> GPT2Config:
    """A GPT-2 config sized for `tokenizer` (vocabulary covers every special token)."""
    from transformers import GPT2Config

    cfg = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # GPT-2's tanh GELU (the same function as the default "gelu_new") as one fused kernel instead of 7 ops.
        activation_function="gelu_pytorch_tanh",
    )
    _no_dropout(cfg)
    return cfg


def build_policy(
    tokenizer: PreTrainedTokenizerBase,
    name_or_path: str | None = None,
    *,
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 128,
    n_positions: int = 128,
    seed: int = 0,
    revision: str | None = None,
    trust_remote_code: bool = False,
    dtype: torch.dtype | str = torch.float32,
) -> PreTrainedModel:
    """A causal LM: loaded through `from_pretrained` when `name_or_path` is set, else a fresh GPT-2; in `dtype`."""
    from transformers import GPT2LMHeadModel

    if name_or_path:
        model = load_pretrained(name_or_path, "AutoModelForCausalLM", tokenizer, revision, trust_remote_code, dtype)
    else:
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(gpt2_config(tokenizer, n_layer, n_head, n_embd, n_positions))
        if isinstance(dtype, torch.dtype):
            model.to(dtype)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def init_score_head(model: PreTrainedModel, head_init: str = "zero") -> None:
    """Initialise a scalar model's `.score` head in place (bias, if any, to 0).

    "zero": every input scores 0 until trained, a neutral start (the value model's, as in lm-human-preferences). Its
    catch: the backbone's gradient is the head's weight times the loss's, so it starts at exactly 0 and grows only as
    fast as the head does; a small learning rate then trains little more than a linear head. "normal": weights drawn
    from N(0, 1 / (d + 1)) for a d-wide hidden state, the reward head of lm-human-preferences (Ziegler et al. 2019) that
    "The N+ Implementation Details of RLHF with PPO" keeps: scores of order 1 at the start (features of norm about
    sqrt(d)), and a backbone gradient from the first step. Draws from torch's global generator: seed it first.
    """
    weight = model.score.weight
    if head_init == "zero":
        torch.nn.init.zeros_(weight)
    elif head_init == "normal":
        with torch.no_grad():
            weight.copy_(torch.randn(weight.shape, dtype=torch.float32) / (weight.shape[-1] + 1) ** 0.5)
    else:
        raise ValueError(f"head_init: {head_init!r} is not one of 'zero', 'normal'")
    if getattr(model.score, "bias", None) is not None:
        torch.nn.init.zeros_(model.score.bias)


def build_scalar_model(source: PreTrainedModel | str | Path, seed: int = 0, trust_remote_code: bool = False,
                       dtype: torch.dtype | str = torch.float32, head_init: str = "zero") -> PreTrainedModel:
    """A backbone with a scalar `.score` head: the reward model, and the value model of PPO.

    `source` is either a causal LM whose backbone weights are copied (the RM starts from SFT, as in InstructGPT)
    or a directory of a saved `*ForSequenceClassification` model (the value model starts from the RM). A loaded
    model's weights are in `dtype` ("auto": as saved); a copied one keeps the source's dtype, and its fresh head is
    initialised by `head_init` (`init_score_head`).
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if isinstance(source, (str, Path)):
        kw = hub_kwargs(None, trust_remote_code)
        config = AutoConfig.from_pretrained(str(source), num_labels=1, **kw)
        _no_dropout(config)
        return AutoModelForSequenceClassification.from_pretrained(str(source), config=config, dtype=dtype,
                                                                  **kw).eval()
    cfg = source.config.__class__.from_dict(source.config.to_dict())
    cfg.num_labels = 1
    _no_dropout(cfg)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(cfg).to(source.dtype)
    missing, _ = model.base_model.load_state_dict(source.base_model.state_dict(), strict=False)
    if missing:
        raise ValueError(f"backbone weights missing when copying from the policy: {missing[:5]}")
    init_score_head(model, head_init)
    return model.eval()


def build_reward_base(name_or_path: str, tokenizer: PreTrainedTokenizerBase, seed: int = 0, revision: str | None = None,
                      trust_remote_code: bool = False, dtype: torch.dtype | str = torch.float32,
                      head_init: str = "zero") -> PreTrainedModel:
    """A reward model from a pretrained checkpoint of its own (`reward.name_or_path`): its backbone, and a fresh
    scalar head initialised by `head_init` (`init_score_head`)."""
    torch.manual_seed(seed)
    model = load_pretrained(name_or_path, "AutoModelForSequenceClassification", tokenizer, revision,
                            trust_remote_code, dtype, num_labels=1)
    init_score_head(model, head_init)
    return model.eval()


def fit_length(max_length: int, model: PreTrainedModel) -> int:
    """A configured sequence length, capped at what the model's position embeddings cover."""
    return min(max_length, getattr(model.config, "max_position_embeddings", None) or max_length)


def set_checkpointing(model: PreTrainedModel, on: bool) -> None:
    """Turn transformers' gradient (activation) checkpointing on or off. Non-reentrant: the variant that works under
    DDP (no "marked ready twice") and without inputs that require grad. It recomputes only in training mode."""
    if on and not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"gradient checkpointing: {type(model).__name__} does not support it")
    # transformers 5 renamed it activation checkpointing; 4.x has only the old name.
    if on:
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)(
            {"use_reentrant": False})
    else:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()


def freeze(model: PreTrainedModel) -> PreTrainedModel:
    """Frozen models (reference, reward) keep no autograd state: no grads, eval mode."""
    model.requires_grad_(False)
    return model.eval()


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
