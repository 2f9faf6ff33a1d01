"""Config of the DPO stage: direct preference optimisation, a branch of the DAG beside reward model -> PPO."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlhf_lib.config.stages import LoRAKeys


class DPOConfig(LoRAKeys):
    """Direct preference optimisation (`stages.dpo`): a branch of the DAG beside reward model -> PPO that trains the
    SFT model on the preference pairs directly, with the frozen SFT model as the reference."""

    enabled: bool = Field(False, description="Run the DPO stage in the `full` and `eval` pipelines (data -> sft -> "
                          "dpo, beside the reward model and PPO; `rlhf run dpo` runs it whatever this says), and "
                          "sample its policy in the eval beside PPO's as one more arm (dpo_*, <figure>_lead_over_dpo). "
                          "Not part of the DPO stage's cache key.")
    beta: float = Field(0.1, gt=0, description="β: the strength of the implicit KL to the reference; the implicit "
                        "reward of a reply is β·(log π − log π_ref), summed over its tokens.")
    loss_type: Literal["sigmoid", "ipo"] = Field(
        "sigmoid", description="sigmoid: DPO's −log σ(β·h), h = (log π_c − log π_ref,c) − (log π_r − log π_ref,r), "
        "log-probs summed over each response's tokens (Rafailov et al. 2023); ipo: (h̄ − 1/(2β))², h̄ the same "
        "difference of the log-ratios divided by each response's tokens (EOS included), which stops pushing at a "
        "finite margin (Azar et al. 2023). TRL 1.12's definitions (`benchmarks/dpo_vs_trl.py`).")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="sigmoid only: probability eps that a pair's label "
                                   "is flipped (conservative DPO): −(1−eps) log σ(β·h) − eps log σ(−β·h), as TRL's "
                                   "sigmoid computed it up to 0.28 (TRL ≥ 0.29 ignores label_smoothing for sigmoid). "
                                   "0 = plain DPO.")
    epochs: int = Field(1, ge=1, description="Passes over the preference pairs.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps (the learning-rate "
                                  "schedule ends there too). null = every epoch.")
    batch_size: int = Field(16, ge=1, description="Preference pairs per optimizer step (every pair of each ranked "
                            "list, as the reward model takes them, shuffled over all lists).")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (linear decay to 0 after a 5% warm-up).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Global gradient-norm clip of each step.")
    max_length: int = Field(96, ge=8, description="Longest prompt + response in tokens; longer rows are cut as SFT "
                            "cuts them (the prompt from the left first).")
    micro_batch_tokens: int | None = Field(None, ge=1, description="Token budget of one training forward pass: "
                                           "a step's rows (a chosen and a rejected row per pair) are sorted by "
                                           "length and cut into forwards of at most this many padded tokens (rows x "
                                           "longest row), so short rows skip a long row's padding. The loss and its "
                                           "one backward still cover the whole batch, so this saves compute, not "
                                           "activation memory; results agree up to float rounding. null = one "
                                           "forward per batch.")
    eval_batch_size: int = Field(64, ge=1, description="Pairs per forward pass of the reference log-probs and of the "
                                 "held-out accuracy: caps their activation memory; the same results.")
    seed: int = Field(0, description="Seed of the pairs' order (and of LoRA's initial adapters).")

    @model_validator(mode="after")
    def _smoothing_is_sigmoid_only(self) -> "DPOConfig":
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError(f"dpo.label_smoothing applies to loss_type sigmoid only (got loss_type {self.loss_type})")
        return self

    def key(self) -> dict:
        """The config as the DPO stage's cache key reads it: without `enabled`, which only chooses whether it runs, and
        without `micro_batch_tokens` when unset, so a run's key is what it was before the key existed."""
        return self.model_dump(exclude={"enabled"} | ({"micro_batch_tokens"} if self.micro_batch_tokens is None
                                                      else set()))
