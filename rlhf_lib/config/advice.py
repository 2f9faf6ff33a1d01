"""Advice on a config that validates but will not train well: the defaults (and the demo presets) are sized for the
built-in tiny GPT-2, whose learning rates are 30-300 times what a pretrained model takes.

A pure function of the config; the caller decides how to show the messages (flows/settings.py warns).

Pretrained-model rates in the literature (full fine-tuning, not LoRA):
- "The N+ Implementation Details of RLHF with PPO" (Huang et al. 2024; vwxyzjn/summarize_from_feedback_details):
  3e-6 for SFT, reward model and PPO (Pythia 1B-6.9B).
- TRL's examples: SFT 2e-5 (trl/scripts/sft.py, Qwen2-0.5B), reward model 1e-5 (reward_modeling.py,
  Qwen2-0.5B-Instruct), PPO 3e-6 (docs/ppo_trainer, examples/scripts/ppo/ppo_tldr.py).
- OpenRLHF's examples/scripts: SFT 5e-6, reward model 9e-6, PPO actor 5e-7 and critic 9e-6.
- GPT-2 124M (lm-human-preferences, reproduced in vwxyzjn/lm-human-preference-details): reward model 5e-5,
  PPO 1e-5, the largest rates of the lot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlhf_lib.config import PipelineConfig

# The presets of pretrained models, each sized from the literature (flows/presets/).
PRETRAINED_PRESETS = ("smollm2-hh", "gpt2-124m", "qwen-0.5b")


def presets_hint(name: str) -> str:
    """Where to start instead: the pretrained presets, less the one in use (an override of its own key is what
    went wrong there)."""
    others = [p for p in PRETRAINED_PRESETS if p != name]
    hint = "start from " + " or ".join(f"--preset {p}" for p in others)
    if name in PRETRAINED_PRESETS:
        return f"the {name} preset itself is sized for it (an override changed the key), or {hint}"
    return hint

# (key, ceiling: about twice the largest rate any source above uses for that stage, the values to quote)
LR_CEILINGS = (
    ("sft.lr", 5e-5, "2e-5 (TRL's SFT example) or 3e-6 (N+ details)"),
    ("reward.lr", 1e-4, "1e-5 (TRL's reward-model example), 5e-5 for GPT-2 124M (lm-human-preferences)"),
    ("ppo.lr", 2e-5, "3e-6 (N+ details, TRL's PPO docs) or 5e-7 (OpenRLHF)"),
    ("ppo.value_lr", 2e-5, "9e-6 (OpenRLHF's critic_learning_rate)"),
    ("dpo.lr", 2e-6, "1e-6 (the DPO paper, TRL's DPOConfig default) or 5e-7 (Zephyr)"),
)
# The tiny model's context; pretrained models read 1024 tokens or more.
MIN_POSITIONS = 256
MIN_LENGTH = 256


def _get(cfg: PipelineConfig, dotted: str) -> object:
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def tiny_defaults(cfg: PipelineConfig) -> list[str]:
    """One message per key left at a value sized for the tiny built-in GPT-2 while a pretrained model is loaded
    (`model.name_or_path`, or `reward.name_or_path` for the reward keys); [] for a fresh model. Each message names
    the key, its value, and a literature value or the preset to start from."""
    policy, reward = cfg.model.name_or_path, cfg.model.name_or_path or cfg.reward.name_or_path
    out: list[str] = []
    # Keys of a stage that trains nothing: SFT with max_steps 0, the reward stage without a reward model, DPO off.
    idle = {"sft": cfg.sft.max_steps == 0, "reward": cfg.ppo.reward_model is None, "dpo": not cfg.dpo.enabled}
    for key, ceiling, sized in LR_CEILINGS:
        loaded = reward if key.startswith("reward.") else policy
        value = _get(cfg, key)
        if not loaded or value is None or value <= ceiling or idle.get(key.split(".")[0]):
            continue
        if (key.startswith("ppo.") and cfg.ppo.lora) or (key.startswith("dpo.") and cfg.dpo.lora):
            continue  # LoRA adapters train at larger rates; no source above sizes them for PPO or DPO
        out.append(f"{key}={value:g} is sized for the built-in tiny GPT-2; a pretrained model ({loaded}) "
                   f"fine-tunes at about {sized}: set it, or {presets_hint(cfg.name)}")
    if policy and cfg.model.n_positions < MIN_POSITIONS and cfg.data.task != "arithmetic":  # arithmetic rows: short
        out.append(f"model.n_positions={cfg.model.n_positions} cuts every prompt + response of {policy} to that "
                   f"many tokens (the tiny model's context); the N+ details use a 512-token query and a 638-token "
                   f"query + response: {presets_hint(cfg.name)}")
    if policy and cfg.ppo.logprob_chunk is None:
        out.append(f"ppo.logprob_chunk=null projects every response position of {policy} to its whole vocabulary at "
                   "once (a (rows, response, vocabulary) float32 block, kept for the backward pass): set "
                   f"ppo.logprob_chunk=64, or {presets_hint(cfg.name)}")
    for key in ("sft.max_length", "reward.max_length", "dpo.max_length"):
        loaded = reward if key.startswith("reward.") else policy
        if loaded and _get(cfg, key) < MIN_LENGTH and not idle[key.split(".")[0]]:
            out.append(f"{key}={_get(cfg, key)} cuts the training rows of {loaded} to that many tokens (sized for "
                       f"the demo task's short rows): {presets_hint(cfg.name)}")
    return out
