"""Config of SFT, reward-model training, evaluation and the training processes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlhf_lib.config.base import Section


class SFTConfig(Section):
    epochs: int = Field(3, ge=1, description="Passes over the demonstrations.")
    batch_size: int = Field(32, ge=1, description="Demonstrations per optimizer step.")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate (linear decay to 0 after a 5% warm-up).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_length: int = Field(96, ge=8, description="Longest prompt + response in tokens; longer rows are cut.")
    seed: int = Field(0, description="Seed of data order.")


class RewardConfig(Section):
    epochs: int = Field(2, ge=1, description="Passes over the ranked lists.")
    batch_size: int = Field(16, ge=1, description="Ranked lists per optimizer step (all K(K-1)/2 pairs of each).")
    lr: float = Field(5e-4, gt=0, description="AdamW learning rate (linear decay to 0 after a 5% warm-up).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_length: int = Field(96, ge=8, description="Longest prompt + response in tokens; longer rows are cut.")
    init_from_sft: bool = Field(True, description="Start the reward model's backbone from the SFT model (unless "
                                "reward.name_or_path is set).")
    seed: int = Field(0, description="Seed of data order and the scalar head.")
    name_or_path: str | None = Field(None, description="Base model of the reward model (hub name or local "
                                     "directory), with its own tokenizer; null = from the policy's (see init_from_sft).")
    revision: str | None = Field(None, description="Git revision of a hub reward base model.")
    trust_remote_code: bool = Field(False, description="Let from_pretrained run the reward base model's own code.")


class EvalConfig(Section):
    max_new_tokens: int = Field(32, ge=1, description="Longest response sampled on held-out prompts.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature of SFT and policy on held-out prompts.")
    samples_in_report: int = Field(16, ge=0, description="Rows in the report's sample table.")
    seed: int = Field(1234, description="Seed of held-out sampling (the same for SFT and policy).")


class ResourcesConfig(Section):
    """How the training stages (SFT, reward model, PPO) run: processes, Accelerate config, precision."""

    num_processes: int = Field(1, ge=1, description="Training processes of SFT, RM and PPO. 1 trains in the stage's "
                               "own process; more launch `accelerate launch` (SFT and RM: one process per GPU, or gloo "
                               "CPU processes; PPO: gloo CPU processes).")
    accelerate_config: str | None = Field(
        None, description="Accelerate config file (DDP, FSDP, DeepSpeed) of SFT and RM when num_processes > 1; a "
        "relative path is looked up in the working directory, then in the project's configs/accelerate/. Null: "
        "ddp.yaml with a GPU, cpu_gloo.yaml without. PPO always launches with cpu_gloo.yaml.")
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="Autocast precision of SFT and RM training (fp16 needs a GPU); weights stay float32. PPO "
        "always runs in float32.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass of SFT "
                                         "and RM training: less memory, one more forward pass per step.")
