"""The reward model before training and the text it reads: from `reward.name_or_path` (its own tokenizer and chat
template), from the SFT model (InstructGPT), or a fresh model of the policy's sizes."""

from __future__ import annotations

from pathlib import Path

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data.conversations import RewardRendering, reward_rendering
from rlhf_lib.devices import weights_dtype
from rlhf_lib.model_dirs import load_causal_lm
from rlhf_lib.models import build_policy, build_reward_base, build_scalar_model, load_tokenizer, same_tokenizer
from stages.data import conversations
from stages.models_io import base_model_tags, local_model
from stages.tracking import StageRun


def reward_base(cfg: PipelineConfig) -> str | None:
    """The local folder of `reward.name_or_path` (a .gguf or known name: its imported folder), or None: the RM starts
    from the SFT model. A resolver: called in the reward stage's resolution step, not in its build."""
    r = cfg.reward
    return local_model(r.name_or_path, r.revision) if r.name_or_path else None


def build_reward(cfg: PipelineConfig, sft_dir: Path, source: str | None, run: StageRun | None = None):
    """The untrained reward model and its tokenizer: from `source` (`reward_base`: the folder of
    `reward.name_or_path`, with its own tokenizer), from the SFT model (InstructGPT), or a fresh model of the
    policy's sizes (`reward.init_from_sft=false`)."""
    r = cfg.reward
    if source:
        if run is not None:
            run.set_tags(base_model_tags(r.name_or_path, source, run))
        tokenizer = load_tokenizer(source, r.revision, r.trust_remote_code)
        return build_reward_base(source, tokenizer, r.seed, r.revision, r.trust_remote_code,
                                 weights_dtype(cfg.model.dtype), r.head_init), tokenizer
    sft_model, tokenizer = load_causal_lm(sft_dir, cfg.model.trust_remote_code, weights_dtype(cfg.model.dtype))
    if not r.init_from_sft:
        m = cfg.model
        sft_model = build_policy(tokenizer, None, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                                 n_positions=m.n_positions, seed=r.seed)
    return build_scalar_model(sft_model, seed=r.seed, head_init=r.head_init), tokenizer


def own_rendering(cfg: PipelineConfig, data_dir: Path, sft_dir: Path, tokenizer) -> RewardRendering | None:
    """The RM's own rendering of each prompt (its chat template, `rlhf_lib.data.conversations`) when it has a base
    model of its own whose tokenizer differs from the policy's; None: it reads the policy's text."""
    table = conversations(data_dir, bool(cfg.reward.name_or_path))
    if not table:
        return None
    policy_tokenizer = load_tokenizer(sft_dir, trust_remote_code=cfg.model.trust_remote_code)
    return reward_rendering(table, same_tokenizer(policy_tokenizer, tokenizer), tokenizer, cfg.data.render)
