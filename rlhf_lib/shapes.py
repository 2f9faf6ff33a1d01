"""Model shapes for the memory estimate: a model's config (from a local directory, a known shape, or the hub), what
the estimate needs of it, measured on the `meta` device (no weights are allocated or downloaded), and the bytes of
its activations, logits and KV cache.

Known shapes let `rlhf plan --shape NAME` size a model without the network. Their numbers are the models' own
config.json (hub repositories gpt2, EleutherAI/pythia-160m and -410m, Qwen/Qwen2.5-0.5B and -1.5B); the parameter
counts they give on the meta device are the published ones (GPT-2 124,439,808; Pythia-160M 162,322,944; Pythia-410M
405,334,016; Qwen2.5-0.5B 494,032,768; Qwen2.5-1.5B 1,543,714,304).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlhf_lib.config import ConfigError, PipelineConfig

if TYPE_CHECKING:  # transformers is slow to import: each function imports what it uses
    from transformers import PretrainedConfig

Head = Literal["causal", "scalar"]
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class KnownShape:
    model_type: str
    fields: dict[str, Any]
    hub_names: tuple[str, ...]


def _sizes(hidden: int, layers: int, heads: int, intermediate: int) -> dict[str, int]:
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "intermediate_size": intermediate}


# Pythia: GPT-NeoX, rotary on a quarter of each head, untied output embedding. Qwen2.5: GQA with 2 KV heads, SwiGLU,
# tied embeddings.
_NEOX = {"rotary_pct": 0.25, "tie_word_embeddings": False, "max_position_embeddings": 2048, "vocab_size": 50304,
         "dtype": "float16"}
_QWEN = {"num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
         "max_position_embeddings": 32768, "hidden_act": "silu", "dtype": "bfloat16"}
SHAPES: dict[str, KnownShape] = {
    "gpt2-124m": KnownShape("gpt2", {}, ("gpt2", "openai-community/gpt2")),  # GPT2Config's defaults
    "pythia-160m": KnownShape("gpt_neox", {**_NEOX, **_sizes(768, 12, 12, 3072)},
                              ("EleutherAI/pythia-160m", "EleutherAI/pythia-160m-deduped")),
    "pythia-410m": KnownShape("gpt_neox", {**_NEOX, **_sizes(1024, 24, 16, 4096)},
                              ("EleutherAI/pythia-410m", "EleutherAI/pythia-410m-deduped")),
    "qwen2.5-0.5b": KnownShape("qwen2", {**_QWEN, **_sizes(896, 24, 14, 4864)},
                               ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct")),
    "qwen2.5-1.5b": KnownShape("qwen2", {**_QWEN, **_sizes(1536, 28, 12, 8960)},
                               ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct")),
    # SmolLM2-135M(-Instruct): Llama with GQA (3 KV heads), tied embeddings; `smollm2` is its import name
    # (rlhf_lib.model_import.KNOWN), so `rlhf plan --preset smollm2-hh` sizes it before the first import.
    "smollm2-135m": KnownShape("llama", {**_sizes(576, 30, 9, 1536), "num_key_value_heads": 3, "head_dim": 64,
                                         "vocab_size": 49152, "tie_word_embeddings": True, "hidden_act": "silu",
                                         "max_position_embeddings": 8192, "dtype": "bfloat16"},
                               ("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2")),
}


def known_shape(name: str) -> KnownShape | None:
    """The known shape of a shape name (`qwen2.5-0.5b`) or one of its hub names (`Qwen/Qwen2.5-0.5B`), if any."""
    key = name.lower()
    return next((s for n, s in SHAPES.items() if key == n or key in (h.lower() for h in s.hub_names)), None)


def model_config(name_or_path: str, key: str, revision: str | None = None,
                 trust_remote_code: bool = False) -> PretrainedConfig:
    """The transformers config of a local directory (offline), a known shape, or else a hub model (its config.json
    only, from the local cache or the network). `key` names the config key in errors."""
    from transformers import AutoConfig

    path = Path(name_or_path).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".gguf"):
        try:
            if path.is_dir():
                return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)  # the GGUF's metadata only
        except Exception as e:  # a folder without config.json, a file the GGUF reader refuses, a bad JSON, ...
            what = "GGUF file" if path.is_file() else "model folder"
            raise ConfigError(f"{key}: cannot read the config of the {what} {name_or_path!r} "
                              f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})") from None
    if path.suffix.lower() == ".gguf":
        raise ConfigError(f"{key}: no such GGUF file {name_or_path!r}")
    if (shape := known_shape(name_or_path)) is not None:
        return AutoConfig.for_model(shape.model_type, **shape.fields)
    try:
        return AutoConfig.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}: cannot read the config of {name_or_path!r} ({str(e).splitlines()[0]}); size a "
                          f"known shape offline with `rlhf plan --shape NAME` ({', '.join(SHAPES)})") from None


def fresh_gpt2_config(vocab_size: int, n_layer: int, n_head: int, n_embd: int, n_positions: int) -> PretrainedConfig:
    """The fresh policy's config with the sizes `rlhf_lib.models.gpt2_config` gives it (its vocabulary is the
    trained tokenizer's, `model.vocab_size` tokens, EOS id 0 and PAD id 1)."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                      bos_token_id=0, eos_token_id=0, pad_token_id=1, activation_function="gelu_pytorch_tanh")


@dataclass(frozen=True)
class Arch:
    """What the memory estimate needs of one model. `params` counts tied weights once; `lora_params` is the
    adapters' size for the LoRA rank and targets asked for (0 without LoRA); `dtype` is the checkpoint's."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    gated: bool
    max_positions: int | None
    dtype: str | None
    lora_params: int = 0
    rms_norm: bool = False  # RMSNorm blocks (Llama, Qwen2, Mistral), which compute in float32; else LayerNorm
    python_gelu: bool = False  # an MLP activation written as several tensor ops (GPT-2's `gelu_new`)

    def layer_elements(self) -> int:
        """Elements per token one transformer block keeps for its backward pass in one dtype (SDPA keeps no T x T
        scores; dropout is off in every model of the pipeline, so no masks):

            attention: norm in H + norm out H + Q heads*d + K, V 2*kv*d + output heads*d
            MLP:       norm in H + norm out H + I (up) + I (activation), + 2I more when gated (gate, gate*up),
                       + 3I more when the activation is several ops (`gelu_new`: its pow, sum and tanh)
            e = 4H + 2*heads*d + 2*kv*d + (4 if gated else 2) * I (+ 3I)

        GPT-2 124M with a one-op GELU: e = 16H, i.e. 32*H bytes per token in 16 bits: Korthikanti et al. 2022
        (eq. 1) count 34*H with the two 1-byte dropout masks and without the score term SDPA avoids.
        """
        mlp = (4 if self.gated else 2) * self.intermediate + 3 * self.intermediate * self.python_gelu
        return 4 * self.hidden + 2 * self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim + mlp

    def layer_bytes(self, act_bytes: int, weight_bytes: int) -> int:
        """Bytes per token one block keeps for its backward: `layer_elements` in the compute dtype plus the norms'
        float32 and residual parts, as measured with `torch.autograd.graph.saved_tensors_hooks` (torch 2.13,
        transformers 5; tests/rlhf_lib/test_memory.py pins it):

            weights in the compute dtype:  e*w + 2H*(4 if RMSNorm else w)  (RMSNorm upcasts its input to float32)
            autocast (16-bit compute over float32 weights; the residual stream stays float32):
                RMSNorm: (e + H)*2 + 4H*4      LayerNorm: e*2 + 2H*4
        """
        e, h = self.layer_elements(), self.hidden
        if act_bytes >= weight_bytes:
            return e * act_bytes + 2 * h * (4 if self.rms_norm else act_bytes)
        return (e + h) * act_bytes + 16 * h if self.rms_norm else e * act_bytes + 8 * h


def trained_activations(a: Arch, tokens: int, act_bytes: int, resid_bytes: int, checkpointing: bool) -> int:
    """Bytes a forward keeps for its backward over `tokens` = rows x padded length, with `act_bytes` the compute
    dtype's size (2 under autocast) and `resid_bytes` the weights' (b = `Arch.layer_bytes`; outside the blocks, the
    embedding output and the final norm: o = H*(act_bytes + resid_bytes) + 4H more with RMSNorm):
    tokens * (L*b + o);  with gradient checkpointing each block keeps only its input (the residual stream, in the
    weights' dtype) and one block is recomputed at a time: tokens * (L*H*resid_bytes + b + o)."""
    b = a.layer_bytes(act_bytes, resid_bytes)
    outside = a.hidden * (act_bytes + resid_bytes + 4 * a.rms_norm)
    if checkpointing:
        return tokens * (a.layers * a.hidden * resid_bytes + b + outside)
    return tokens * (a.layers * b + outside)


def forward_activations(a: Arch, tokens: int, act_bytes: int, hidden_states: int = 1) -> int:
    """Bytes of a forward without autograd (scoring, the prompt pass of sampling): intermediates are freed as they
    are used, so at most one block's and the hidden states: tokens * (e + hidden_states*H) * act_bytes, an upper
    bound. `hidden_states` = L + 1 where the forward returns every layer's (`output_hidden_states=True`)."""
    return tokens * (a.layer_elements() + hidden_states * a.hidden) * act_bytes


def logits_bytes(rows: int, positions: int, vocab: int, copies: int) -> int:
    """(rows, positions, V) float32 logits and the copies alive with them: rows * positions * V * 4 * copies."""
    return rows * positions * vocab * 4 * copies


def kv_cache_bytes(a: Arch, rows: int, length: int, act_bytes: int) -> int:
    """Sampling's KV cache, preallocated for prompt + response: 2 * L * kv_heads * head_dim * rows * length * bytes."""
    return 2 * a.layers * a.kv_heads * a.head_dim * rows * length * act_bytes


def _dtype_name(config: PretrainedConfig) -> str | None:
    dtype = getattr(config, "dtype", None)
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _lora_params(model, r: int, targets: list[str] | None, model_type: str) -> int:
    """r * (fan_in + fan_out) for each module peft would adapt (its default targets for the architecture unless
    `targets` names them)."""
    if targets is None:
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults

        if model_type not in defaults:
            raise ConfigError(f"ppo.lora: peft has no default target modules for model type {model_type!r}; set "
                              "ppo.lora_target_modules")
        targets = list(defaults[model_type])
    total = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if name.rsplit(".", 1)[-1] in targets and weight is not None and weight.dim() == 2:
            total += r * sum(weight.shape)  # Linear (out, in) and GPT-2's Conv1D (in, out) alike
    return total


def measure(config: PretrainedConfig, head: Head, lora: tuple[int, list[str] | None] | None = None,
            trust_remote_code: bool = False) -> Arch:
    """Build the model on the `meta` device (shapes only) and read its sizes: a causal LM, or (`scalar`) the
    `*ForSequenceClassification` with one label of the reward and value models. `lora` = (rank, targets)."""
    targets = tuple(lora[1]) if lora and lora[1] is not None else None
    return _measure(type(config), config.to_json_string(), head, lora[0] if lora else 0, targets, trust_remote_code)


@cache
def _measure(config_cls: type, config_json: str, head: Head, lora_r: int, targets: tuple[str, ...] | None,
             trust_remote_code: bool) -> Arch:
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = config_cls.from_dict(json.loads(config_json))
    if head == "scalar":
        config.num_labels = 1
    auto = AutoModelForSequenceClassification if head == "scalar" else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config, trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    hidden, heads = text.hidden_size, text.num_attention_heads
    return Arch(
        params=sum(p.numel() for p in model.parameters()),
        layers=text.num_hidden_layers, hidden=hidden,
        intermediate=getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden,
        heads=heads, kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or hidden // heads, vocab=text.vocab_size,
        gated=any(n.endswith(("gate_proj", "gate_up_proj")) for n, _ in model.named_modules()),
        max_positions=getattr(text, "max_position_embeddings", None), dtype=_dtype_name(config),
        lora_params=_lora_params(model, lora_r, list(targets) if targets else None, config.model_type) if lora_r else 0,
        rms_norm=any(type(m).__name__.endswith("RMSNorm") for m in model.modules()),
        python_gelu=(getattr(text, "activation_function", None) or getattr(text, "hidden_act", None))
        in ("gelu_new", "gelu_fast"),
    )


@dataclass(frozen=True)
class Models:
    """The stages' models: the policy (causal LM, with its LoRA size when ppo.lora), the reward model and PPO's
    separate value model (scalar heads), and the dtype of the trained weights of the policy and of the RM
    (model.dtype; `auto` = the checkpoint's, float32 for a fresh model)."""

    policy: Arch
    reward: Arch
    value: Arch
    dtype: str
    reward_dtype: str


def model_configs(cfg: PipelineConfig) -> tuple[PretrainedConfig, PretrainedConfig]:
    """The transformers configs of the policy (model.name_or_path, or the fresh GPT-2 of model.n_*) and of the
    reward model's base (reward.name_or_path, else the policy's)."""
    m, rw = cfg.model, cfg.reward
    pc = (model_config(m.name_or_path, "model.name_or_path", m.revision, m.trust_remote_code) if m.name_or_path
          else fresh_gpt2_config(m.vocab_size, m.n_layer, m.n_head, m.n_embd, m.n_positions))
    rc = (model_config(rw.name_or_path, "reward.name_or_path", rw.revision, rw.trust_remote_code)
          if rw.name_or_path else pc)
    return pc, rc


def resolve_models(cfg: PipelineConfig) -> Models:
    """Each model's shape from the config: model.name_or_path (or the fresh GPT-2 of model.n_*), reward.name_or_path
    or the policy's architecture, and the value model from the RM (ppo.value_init=reward; the stage takes the SFT
    model instead when the RM reads other token ids) or from the SFT model."""
    m, rw = cfg.model, cfg.reward
    pc, rc = model_configs(cfg)
    lora = (cfg.ppo.lora_r, cfg.ppo.lora_target_modules) if cfg.ppo.lora else None
    policy = measure(pc, "causal", lora, m.trust_remote_code)
    reward = measure(rc, "scalar", None, rw.trust_remote_code if rw.name_or_path else m.trust_remote_code)
    value = reward if cfg.ppo.value_init == "reward" else measure(pc, "scalar", None, m.trust_remote_code)

    def trained(a: Arch) -> str:
        return m.dtype if m.dtype != "auto" else (a.dtype if a.dtype in DTYPE_BYTES else "float32")

    return Models(policy, reward, value, trained(policy), trained(reward))
