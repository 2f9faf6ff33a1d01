"""Config of SFT, reward-model training, evaluation and the training processes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from rlhf_lib.config.base import Section
from rlhf_lib.config.rewards import RewardSource


def no_is_false(value: object) -> object:
    """YAML reads a bare `no` as false (`--set resources.mixed_precision=no`): it means "no" here."""
    return "no" if value is False else value


def check_device(name: str) -> str:
    """Validator of `resources.device`: auto, cpu, cuda or cuda:N (whether that device exists is checked where the
    stage runs, which may be another machine)."""
    if name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit()):
        return name
    raise ValueError(f"expected auto, cpu, cuda or cuda:N (N a GPU index), got {name!r}")


POOLED_STAGES = ("sft", "reward", "ppo", "eval", "dpo")


def check_work_pools(pools: dict[str, str]) -> dict[str, str]:
    """Validator of `resources.work_pools`: stage -> Prefect work pool, for the stages that have a deployment."""
    bad = sorted(set(pools) - set(POOLED_STAGES))
    if bad:
        raise ValueError(f"unknown stage(s) {bad}; a stage on a work pool is one of {list(POOLED_STAGES)}")
    if empty := [k for k, v in pools.items() if not v.strip()]:
        raise ValueError(f"empty work pool name for {empty}")
    return pools


def check_endpoint(endpoint: str | None) -> str | None:
    """Validator of `resources.rdzv_endpoint`: `host:port` (the port is required: every node must use the same)."""
    if endpoint is None:
        return None
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port (e.g. node0.internal:29400), got {endpoint!r}")
    return endpoint


class LoRAKeys(Section):
    """LoRA keys of the supervised stages (`sft.lora`, `reward.lora`)."""

    lora: bool = Field(False, description="Train LoRA adapters (peft) instead of every weight (a reward model's "
                       "scalar head trains whole); they are merged into the weights before the model is saved (a "
                       "plain transformers model). One process only (resources.num_processes=1).")
    lora_r: int = Field(8, ge=1, description="LoRA rank.")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (the update is scaled by alpha / r).")
    lora_target_modules: list[str] | None = Field(None, description="Module names that get adapters; null = peft's "
                                                  "default for the architecture.")


class SFTConfig(LoRAKeys):
    epochs: int = Field(3, ge=1, description="Passes over the demonstrations.")
    max_steps: int | None = Field(None, ge=0, description="Stop after this many optimizer steps (the learning-rate "
                                  "schedule ends there too): a budget for a first run. null = every epoch. 0: no "
                                  "training, the pretrained model.name_or_path is the SFT model (RL from the "
                                  "pretrained model itself).")
    batch_size: int = Field(32, ge=1, description="Demonstrations per optimizer step.")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate (linear decay to 0 after a 5% warm-up).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_length: int = Field(96, ge=8, description="Longest prompt + response in tokens; longer rows are cut.")
    micro_batch_tokens: int | None = Field(None, ge=1, description="Token budget of one training forward pass: "
                                           "a batch's rows are sorted by length and cut into forwards of at most "
                                           "this many padded tokens (rows x longest row), so short rows skip a long "
                                           "row's padding; the loss is still the mean over the batch's response "
                                           "tokens, with one backward, so this saves compute, not activation "
                                           "memory. null = one forward per batch.")
    seed: int = Field(0, description="Seed of data order.")


class RewardConfig(LoRAKeys):
    epochs: int = Field(2, ge=1, description="Passes over the ranked lists.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps (the learning-rate "
                                  "schedule ends there too): a budget for a first run. null = every epoch.")
    batch_size: int = Field(16, ge=1, description="Ranked lists per optimizer step (all K(K-1)/2 pairs of each).")
    lr: float = Field(5e-4, gt=0, description="AdamW learning rate (linear decay to 0 after a 5% warm-up).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    pair_weight: Literal["uniform", "rank_distance"] = Field(
        "uniform", description="Weight of each pair in its list's loss: uniform (InstructGPT) or rank_distance "
        "(pairs ranked further apart, the surer labels of a noisy labeller, weigh more).")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="Probability eps that a pair's label is wrong: "
                                   "the loss -(1-eps) log sigmoid(m) - eps log sigmoid(-m) stops pushing a margin m "
                                   "past log((1-eps)/eps), a guard against fitting noisy human labels. 0 = plain "
                                   "Bradley-Terry.")
    center_coef: float = Field(0.0, ge=0, description="Weight c of c * (r_better + r_worse)^2 per pair (TRL's "
                               "center_rewards_coefficient, Eisenstein et al. 2023, e.g. 0.01): keeps scores centred "
                               "at 0, which pairs alone leave free.")
    max_length: int = Field(96, ge=8, description="Longest prompt + response in tokens; longer rows are cut.")
    micro_batch_tokens: int | None = Field(None, ge=1, description="Token budget of one training forward pass: "
                                           "a batch's rows are sorted by length and cut into forwards of at most "
                                           "this many padded tokens (rows x longest row), so short rows skip a long "
                                           "row's padding. The loss and its one backward still cover the whole "
                                           "batch (its pairs cross the forwards), so this saves compute, not "
                                           "activation memory. null = one forward per batch. With "
                                           "share_prompts it caps prompt and response forwards apart.")
    share_prompts: bool = Field(True, description="Run each distinct prompt of a batch once, with a KV cache, and "
                                "its responses on the cached keys and values: the same scores and gradient up to "
                                "float rounding, with a list's prompt computed once instead of K times. Used where "
                                "the model has a plain KV cache (GPT-2, GPT-NeoX, Llama, Qwen2, ...), gradient "
                                "checkpointing is off and the weights are not sharded (FSDP, DeepSpeed ZeRO-3); "
                                "otherwise every row runs whole.")
    curriculum_steps: int = Field(0, ge=0, description="First optimizer steps (of the same schedule) whose loss "
                                  "covers only each list's closest pair, the two responses fewest character edits "
                                  "apart: a pair that differs in one thing teaches that thing before the easy cues "
                                  "(length, tone) win the gradient. 0 = every pair from the start.")
    init_from_sft: bool = Field(True, description="Start the reward model's backbone from the SFT model (unless "
                                "reward.name_or_path is set).")
    seed: int = Field(0, description="Seed of data order and the scalar head.")
    head_init: Literal["zero", "normal"] = Field(
        "zero", description="The fresh scalar head: zero (every reply scores 0 until trained; the backbone's "
        "gradient starts at 0 and grows with the head, so a small lr trains little but the head) or normal "
        "(N(0, 1/(d+1)) as lm-human-preferences and the N+ details: the backbone learns from the first step).")
    eval_batch_size: int = Field(64, ge=1, description="Held-out pairs per forward pass when the trained reward "
                                 "model's accuracy is measured: caps its activation memory; the same results.")
    baselines: bool = Field(True, description="Score the cheap baselines on the held-out pairs beside the reward "
                            "model (prefer shorter, the policy's zero-shot log-likelihood, an n-gram logistic "
                            "regression and a linear probe on the frozen base model; rlhf_lib/baselines.py), in the "
                            "report and as reward/baseline/* metrics; a reward model that does not beat the "
                            "log-likelihood raises the alarm rm_no_edge.")
    baseline_train_pairs: int = Field(2000, ge=10, description="Training pairs (drawn from the ranked lists with "
                                      "reward.seed) the n-gram regression and the linear probe are fit on.")
    baseline_heldout_pairs: int | None = Field(
        None, ge=1, description="The first this many held-out pairs the baselines score (null: every one). The "
        "log-likelihood and the probe each cost two forward passes a pair, the reward model's own count again "
        "(SmolLM2 on HH: 1,900 passes beside training); the reward model's lead over each baseline, and the "
        "rm_no_edge alarm, are read on the same pairs.")
    name_or_path: str | None = Field(None, description="Base model of the reward model (hub name or local "
                                     "directory), with its own tokenizer; null = from the policy's (see "
                                     "init_from_sft).")
    revision: str | None = Field(None, description="Git revision of a hub reward base model.")
    trust_remote_code: bool = Field(False, description="Let from_pretrained run the reward base model's own code.")


class EvalConfig(Section):
    max_new_tokens: int = Field(32, ge=1, description="Longest response sampled on held-out prompts.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature of SFT and policy on held-out prompts.")
    samples_in_report: int = Field(16, ge=0, description="Rows in the report's sample table.")
    max_prompts: int | None = Field(None, ge=1, description="Sample SFT and policy on the first this many held-out "
                                    "prompts only (the reward model's held-out accuracy still covers every held-out "
                                    "pair): a budget for a first run. null = all of them.")
    seed: int = Field(1234, description="Seed of held-out sampling (the same for SFT and policy).")
    batch_size: int = Field(64, ge=1, description="Held-out prompts per sampling and scoring batch: caps the eval's "
                            "activation memory (the seeded draws are per batch, so it is part of the samples' seed).")
    best_of: list[Annotated[int, Field(ge=2)]] = Field([4, 16], description="Best-of-n baselines: n samples "
                                                       "of the SFT model per prompt, the one the reward sources score "
                                                       "highest kept (Gao et al. 2023), judged like PPO's replies "
                                                       "(best_of_<n>_* metrics; KL log n - (n-1)/n). [] = none.")
    best_of_prompts: int | None = Field(128, ge=1, description="The first this many eval prompts get the best-of-n "
                                        "samples (max(best_of) SFT samples each); PPO is compared with them on the "
                                        "same prompts. null = every eval prompt.")
    constant_reply_prompts: int = Field(
        16, ge=0, description="Demo task: the validation prompts on which the reward model picks the best constant "
        "reply (one template, the topic filled in; rlhf_lib/demo_task/constant.py), judged by gold beside PPO. "
        "0: off.")
    judge_pairs: int | None = Field(None, ge=1, description="Each judge of ppo.rewards is measured on the first this "
                                    "many held-out pairs (two rubric prompts per pair through the judge model); the "
                                    "reward model's accuracy still covers every pair. null = all of them.")

    controls: list[Literal["zero_reward", "shuffled_reward"]] = Field(
        [], description="Control arms of PPO, each a cached sibling of the PPO stage with the same settings, seed, "
        "SFT model, RM and budget (`ppo.reward_control`): zero_reward (the reward sources' score replaced by 0, so the "
        "missing-EOS penalty and the KL alone act) and shuffled_reward (the scores permuted within each rollout). The "
        "eval samples each beside PPO and reports PPO's paired lead over it (<figure>_lead_over_<control>): what the "
        "reward taught beyond the shaping. Never registered as rlhf-policy versions. [] = none.")
    group_by: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,39}$", description="A column of the eval prompts (e.g. the chained "
        "arithmetic task's calls) whose values split the figures: by_<column>_<value>/<figure> for the reward of "
        "policy, SFT and each control, and the paired leads, each with its interval (at most 32 groups, the "
        "most frequent). Null = no split.")
    judge: RewardSource | None = Field(
        None, description="A judge PPO never optimised, scoring PPO, SFT and best-of-n on the held-out prompts: its "
        "scores are the eval's gold (gold_reward_mean, win_rate_vs_sft, best_of_<n>_gold_*, each with its interval) "
        "in place of the demo task's judge. Any reward source but environment: {name: judge, kind: model, model: "
        "models:/rlhf-judge-rm/1} (a reward model trained on other pairs; model is required), {kind: judge, model: "
        "smollm2, template: ...}, a function or an endpoint. Its weight is unused.")

    @model_validator(mode="after")
    def _an_independent_judge(self) -> "EvalConfig":
        j = self.judge
        if j is not None and j.kind == "environment":
            raise ValueError("eval.judge: kind environment scores episodes, not replies; use kind model, judge, "
                             "function or http")
        if j is not None and j.kind == "model" and not j.model:
            raise ValueError("eval.judge: kind model needs model (the URI of a reward model PPO did not train "
                             "against, e.g. models:/rlhf-judge-rm/1)")
        return self

    def key(self) -> dict:
        """The config as the eval stage's cache key reads it: without `judge_pairs`, `judge` and `controls` when
        they are unset, so a run's key is what it was before the keys existed."""
        unset = {k for k in ("judge_pairs", "judge", "group_by") if getattr(self, k) is None}
        if not self.controls:
            unset.add("controls")
        return self.model_dump(exclude=unset or None)


class ResourcesConfig(Section):
    """Where and how the stages run: device, processes, Accelerate config, precision, memory."""

    device: Annotated[str, AfterValidator(check_device)] = Field(
        "auto", description="Device of every stage (SFT, RM, PPO's four models, eval): auto (CUDA when available, "
        "else CPU), cpu, cuda or cuda:N. Launched processes take one GPU each (cuda:LOCAL_RANK).")
    num_processes: int = Field(1, ge=1, description="Training processes of SFT, RM and PPO. 1 trains in the stage's "
                               "own process; more launch `accelerate launch` (one process per GPU, or gloo CPU "
                               "processes with resources.device=cpu or without a GPU).")
    accelerate_config: str | None = Field(
        None, description="Accelerate config file (DDP, FSDP, DeepSpeed) of SFT and RM when num_processes > 1; a "
        "relative path is looked up in the working directory, then in the project's configs/accelerate/. Null: "
        "ddp.yaml on GPUs, cpu_gloo.yaml on CPUs. PPO launches with ddp.yaml or cpu_gloo.yaml by its device.")
    mixed_precision: Annotated[Literal["no", "bf16", "fp16"], BeforeValidator(no_is_false)] = Field(
        "no", description="Autocast precision of every stage (SFT, RM, PPO, eval); trainable weights and optimizer "
        "state stay in model.dtype (float32 by default). fp16 needs a GPU; PPO takes bf16 or no.")
    frozen_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights dtype of PPO's frozen reference and reward model (half the memory in "
        "bfloat16; their outputs are cast to float32 before the KL and the score).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass of SFT "
                                         "and RM training: less memory, one more forward pass per step.")
    memory_gb: float | None = Field(None, gt=0, description="Memory budget of one device for the preflight "
                                    "estimate (`rlhf plan`); null = the GPU's total memory, or no check on CPU.")
    work_pools: Annotated[dict[str, str], AfterValidator(check_work_pools)] = Field(
        {}, description="Stage -> Prefect work pool (sft, reward, ppo, eval, dpo), e.g. {ppo: gpu}: the `rlhf` flow "
        "runs that stage through its deployment rlhf/<stage>, which must be on that pool, and waits for it; the "
        "other stages run in the flow's own process. Artifacts travel through MLflow.")
    pool_timeout_s: float = Field(600.0, gt=0, description="How long a stage sent to a work pool waits for a worker "
                                  "to pick it up before failing with the pool's name (once running it has no limit).")
    num_machines: int = Field(1, ge=1, description="Machines (nodes) of SFT, RM and PPO training, each with "
                              "resources.num_processes processes; more than 1 needs resources.rdzv_endpoint and "
                              "the same pipeline started on every node with its own resources.machine_rank.")
    machine_rank: int = Field(0, ge=0, description="This node's rank, 0..num_machines-1. Node 0 logs, registers and "
                              "caches; the others train with it and then take its results from MLflow.")
    rdzv_endpoint: Annotated[str | None, AfterValidator(check_endpoint)] = Field(
        None, description="host:port of node 0 where the nodes meet (torch's c10d TCPStore); the launch itself "
        "uses the next port. Fixed, so that firewalls can open it.")
    rdzv_timeout_s: float = Field(300.0, gt=0, description="How long the nodes wait for each other (to meet, "
                                  "and in a collective: a node that dies mid-run fails the others within it).")

    @model_validator(mode="after")
    def _nodes(self) -> ResourcesConfig:
        if self.machine_rank >= self.num_machines:
            raise ValueError(f"resources.machine_rank {self.machine_rank} must be below resources.num_machines "
                             f"{self.num_machines}")
        if self.num_machines > 1 and self.rdzv_endpoint is None:
            raise ValueError("resources.num_machines > 1 needs resources.rdzv_endpoint (host:port of node 0)")
        if self.num_machines > 1 and self.work_pools:
            raise ValueError("resources.work_pools with resources.num_machines > 1: a stage sent to a pool runs as one "
                             "node; start the pipeline on every node instead (a flow run per node, each with its "
                             "machine_rank)")
        return self
