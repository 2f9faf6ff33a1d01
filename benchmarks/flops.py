"""Analytic FLOP counts of a decoder-only transformer and of one RLHF-PPO iteration (for MFU / roofline figures).

Counting rules (Kaplan et al. 2020, "Scaling Laws", table 1; Chinchilla appendix F), one multiply-add = 2 FLOPs:
    per token and layer, projections:  2 * (4 d^2 + 2 d f)          q,k,v,out (4 d^2) and the MLP (2 d f)
    per token and layer, attention:    4 d c                          Q K^T and A V over c visible keys
    per projected token, LM head:      2 d V
    backward = 2 x forward (gradients w.r.t. activations and weights).
Only useful work is counted: causal attention (a query at position i sees i keys), the LM head only where a
log-prob is needed, no padding. Layer norms, softmax, GELU and embeddings are left out (a few % at d = 256).
Both sides of a comparison are counted the same way, so the figure measures efficiency, not extra work.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """Sizes of a GPT-style model: n_layer blocks of width d, MLP width f (GPT-2: 4 d), vocabulary V; `kv` the width
    of K and V (grouped-query attention: kv_heads x head_dim; d without it) and `gated` a SwiGLU MLP (Llama, Qwen2:
    three d x f matrices instead of two)."""

    n_layer: int
    d: int
    vocab: int
    ffn: int | None = None
    kv: int | None = None
    gated: bool = False

    @property
    def f(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.d

    @classmethod
    def of(cls, config) -> Shape:
        """The shape of a transformers config (GPT-2, GPT-NeoX, Llama, Qwen2, ...)."""
        text = config.get_text_config()
        d = text.hidden_size
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or d // heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        ffn = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * d
        gated = getattr(text, "hidden_act", "") in ("silu", "swiglu") and text.model_type not in ("gpt2", "gpt_neox")
        return cls(text.num_hidden_layers, d, text.vocab_size, ffn, kv_heads * head_dim, gated)


def body_flops(s: Shape, tokens: int) -> int:
    """Projection FLOPs of the transformer body for `tokens` token positions (attention scores excluded):
    2 L (2 d^2 + 2 d kv + m d f) per token, m = 3 for a gated MLP, else 2 (= 2 L (4 d^2 + 2 d f) for GPT-2)."""
    kv = s.kv if s.kv is not None else s.d
    return 2 * s.n_layer * (2 * s.d * s.d + 2 * s.d * kv + (3 if s.gated else 2) * s.d * s.f) * tokens


def attention_flops(s: Shape, key_counts: int) -> int:
    """Attention-score FLOPs for queries that together see `key_counts` keys (sum over queries of keys seen)."""
    return 4 * s.n_layer * s.d * key_counts


def causal_keys(n: int, past: int = 0) -> int:
    """Sum of visible keys for `n` consecutive queries after `past` cached positions: sum_{i=1..n} (past + i)."""
    return n * past + n * (n + 1) // 2


def forward_flops(s: Shape, batch: int, length: int, head_positions: int) -> int:
    """One causal forward over (batch, length) tokens with the LM head on `head_positions` positions per row."""
    return batch * (body_flops(s, length) + attention_flops(s, causal_keys(length)) + 2 * s.d * s.vocab * head_positions)


def generate_flops(s: Shape, batch: int, prompt: int, new: int) -> int:
    """Sampling `new` tokens with a KV cache: a prefill over the prompt, then new - 1 single-token steps; the LM
    head runs once per sampled token."""
    prefill = body_flops(s, prompt) + attention_flops(s, causal_keys(prompt))
    steps = body_flops(s, new - 1) + attention_flops(s, causal_keys(new - 1, past=prompt))
    return batch * (prefill + steps + 2 * s.d * s.vocab * new)


def ppo_iteration_flops(
    policy: Shape, critic: Shape, reward: Shape, batch: int, prompt: int, new: int, epochs: int = 1,
    shared_critic: bool = False,
) -> dict[str, int]:
    """FLOPs of one PPO iteration with a separate value model (TRL's PPOv2 layout), by phase. With
    `shared_critic` the value head reads the policy's forward in the update (no second body forward/backward); in
    scoring the values still take one body forward (of the policy instead of the value model).

    generate: sampling (log-probs come from the sampling step, no extra forward).
    score:    reference forward (LM head on the `new` response positions), value and reward forwards (scalar
              heads, 2 d per position, left out).
    update:   per epoch, policy and value forward + backward (3 x forward) over the whole rollout.
    """
    t = prompt + new
    ref = forward_flops(policy, batch, t, new)
    value = forward_flops(Shape(critic.n_layer, critic.d, 0, critic.ffn), batch, t, 0)
    rm = forward_flops(Shape(reward.n_layer, reward.d, 0, reward.ffn), batch, t, 0)
    out = {
        "generate": generate_flops(policy, batch, prompt, new),
        "score": ref + value + rm,
        "update": epochs * 3 * (ref + (0 if shared_critic else value)),
    }
    out["total"] = sum(out.values())
    return out
