"""Config of PPO: rollouts, rewards, critic, update, alarms (docs/ppo.md)."""

from __future__ import annotations

import importlib.util
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from rlhf_lib.config.async_rollouts import AsyncRolloutsConfig
from rlhf_lib.config.base import Section
from rlhf_lib.config.rewards import RewardSource, check_rewards, default_rewards

VLLM_INSTALL_HINT = "pip install 'rlhf-pipeline[vllm]'"
# ppo.rollout_engine=compiled rounds each prompt width up to a multiple of this (rlhf_lib.lm.compiled): its static KV
# cache holds up to this many positions - 1 of extra left padding (rlhf_lib.memory counts them).
COMPILED_PROMPT_BUCKET = 64
COMPILED_GRAPHS = 2  # compiled graphs, each with its static cache, that one decoder keeps (the latest used)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_engine(name: str) -> str:
    """Validator of `ppo.rollout_engine`: `vllm` needs the vLLM package (the config is refused without it)."""
    if name == "vllm" and not vllm_available():
        raise ValueError(f"rollout_engine 'vllm' needs vLLM, which is not installed here: {VLLM_INSTALL_HINT} "
                         "(a CUDA GPU is needed too), or use rollout_engine 'hf'")
    return name


class PPOConfig(Section):
    iterations: int = Field(40, ge=1, description="Rollout/update iterations.")
    batch_size: int = Field(64, ge=1, description="Prompts per rollout.")
    max_new_tokens: int = Field(32, ge=1, description="Longest response; sampling stops early at EOS.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature; the same one divides logits in every log-prob.")
    epochs: int = Field(4, ge=1, description="PPO epochs over each rollout.")
    minibatches: int = Field(4, ge=1, description="Minibatches per epoch (batch_size must divide evenly).")
    score_batch_size: int = Field(16, ge=1, description="Rows per forward pass in the score phase (reference "
                                  "log-probs, values, RM scores): caps that phase's activation memory; same results.")
    lr: float = Field(3e-4, gt=0, description="Adam learning rate of policy and value model.")
    clip_eps: float = Field(0.2, gt=0, description="Clip range of the surrogate objective (PPO, eq. 7).")
    value_clip: float = Field(0.2, gt=0, description="Clip range of the value prediction around the rollout's value.")
    vf_coef: float = Field(0.1, ge=0, description="Weight of the value loss.")
    ent_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of GAE.")
    lam: float = Field(0.95, ge=0, le=1, description="Lambda of GAE.")
    kl_coef: float = Field(0.05, ge=0, description="Initial beta of the per-token KL penalty.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k1", description="Per-token KL estimator in the reward.")
    adaptive_kl: bool = Field(True, description="Adapt beta toward target_kl (Ziegler et al. 2019).")
    target_kl: float = Field(3.0, gt=0, description="Target of the adaptive controller: KL per response, in nats.")
    kl_horizon: int = Field(10000, ge=1, description="Horizon of the adaptive controller, in samples.")
    whiten_advantages: bool = Field(True, description="Whiten advantages over the rollout (masked; gae and rloo).")
    max_grad_norm: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    # Rewards (N+ implementation details, Huang et al. 2024; trlx running reward scaling).
    stop_at_eos: bool = Field(True, description="Stop sampling a row at its EOS; false samples max_new_tokens for "
                              "every row and masks everything after the first EOS (fixed-length rollouts).")
    missing_eos_penalty: float | None = Field(None, ge=0, description="Subtracted from the RM score of a response "
                                              "that ends without EOS; null = off.")
    rm_offset_samples: int = Field(128, ge=0, description="RM offset normalisation: before iteration 0, score this "
                                   "many samples of the SFT policy and subtract their mean score from every score, "
                                   "so SFT samples average 0; 0 = off.")
    rm_unit_std: bool = Field(False, description="With rm_offset_samples: also divide every score by the standard "
                              "deviation of those SFT samples' scores, so SFT scores have mean 0 and std 1 (the gain "
                              "and bias of lm-human-preferences, N+ details). A reward model whose scores spread by "
                              "1e-3 (a zero-initialised head after a few steps) otherwise weighs nothing beside the "
                              "KL penalty and the missing-EOS penalty.")
    reward_control: Literal["none", "zero_reward", "shuffled_reward"] = Field(
        "none", description="A control arm (set by `eval.controls`, not by hand): zero_reward replaces the summed score "
        "of the reward sources by 0 (after the RM offset and scale, so the SFT samples' mean), shuffled_reward permutes "
        "it within each rollout; the missing-EOS penalty, whitening, clipping and KL still apply. What such a run "
        "learns is what the shaping alone teaches.")
    rewards: list[RewardSource] = Field(
        default_factory=default_rewards, description="Reward sources, each {name, kind: model|function|http, weight, "
        "...}; their weighted sum is the score on the last real token. Default: the reward stage's RM alone. "
        "Without a source of kind model the reward stage does not run.")
    # Multi-turn rollouts (docs/environments.md).
    environment: str | None = Field(None, description="Multi-turn rollouts against an environment: a built-in "
                                    "(calculator) or package.module:Class (a deployment run needs the host's "
                                    "allow-list entry environment:package.module:Class). Its rewards are the "
                                    "reward source of kind environment. Null = one prompt, one reply.")
    max_turns: int = Field(1, ge=1, description="With ppo.environment: most policy turns per episode; each turn "
                           "samples up to max_new_tokens.")
    max_episode_tokens: int | None = Field(None, ge=1, description="With ppo.environment: most response tokens "
                                           "per episode, the policy's and the environment's; null = max_turns x "
                                           "max_new_tokens.")
    whiten_rewards: bool = Field(False, description="Normalise scores by a running mean and std over all rollouts.")
    reward_clip: float | None = Field(None, gt=0, description="Clip the (normalised) score to [-c, c]; null = off.")
    # Critic.
    advantage_estimator: Literal["gae", "grpo", "rloo"] = Field(
        "gae", description="gae: value model + GAE; grpo: group-normalised sequence reward; rloo: leave-one-out "
        "baseline. grpo and rloo load no value model.",
    )
    group_size: int = Field(4, ge=2, description="grpo/rloo: samples per prompt (batch_size must divide evenly).")
    critic: Literal["separate", "shared"] = Field(
        "separate", description="gae: a separate value model, or a value head on the policy's own backbone.",
    )
    value_init: Literal["reward", "sft"] = Field("reward", description="Separate critic: start from the reward "
                                                 "model or from the SFT backbone with a zero head.")
    critic_warmup: int = Field(0, ge=0, description="Iterations of value-only updates before the policy moves.")
    value_lr: float | None = Field(None, gt=0, description="Learning rate of the critic; null = ppo.lr.")
    # Update.
    lr_schedule: Literal["constant", "linear"] = Field("constant", description="Learning rate over iterations: "
                                                       "constant, or linear decay to 0 at the last iteration.")
    adam_eps: float = Field(1e-5, gt=0, description="Adam epsilon (1e-5 as in OpenAI baselines' PPO).")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per minibatch; the gradient is "
                                             "the same as one minibatch at a fraction of the memory.")
    early_stop_kl: float | None = Field(None, gt=0, description="End the update's epochs early once a minibatch's "
                                        "approximate KL(old || new) exceeds this; null = never.")
    gradient_checkpointing: bool = Field(False, description="Recompute the policy's and the value model's "
                                         "activations in the backward pass: less memory, one more forward per step.")
    logprob_chunk: int | None = Field(None, ge=1, description="Response positions whose logits (B x chunk x "
                                      "vocabulary, float32) exist at once when log-probs and entropy are computed; "
                                      "in training each chunk's logits are recomputed in the backward pass (the "
                                      "pretrained presets use 64). Null = the whole response at once, through the "
                                      "model's own forward. The same results up to float rounding.")
    micro_batch_tokens: int | None = Field(None, ge=1, description="Token budget of an update micro-batch (rows x "
                                           "padded length): rows are sorted by length and packed up to it, so short "
                                           "rows share a micro-batch; the same gradient. Null = "
                                           "gradient_accumulation_steps equal splits.")
    ptx_coef: float = Field(0.0, ge=0, description="PPO-ptx (InstructGPT): weight of the SFT loss on "
                            "demonstrations mixed into every update step; 0 = off.")
    ptx_batch_size: int = Field(8, ge=1, description="PPO-ptx: demonstrations per update step.")
    lora: bool = Field(False, description="Train LoRA adapters (peft) on the policy instead of all its weights; the "
                       "reference is then the policy with its adapters disabled, so no second copy is loaded.")
    lora_r: int = Field(8, ge=1, description="LoRA rank.")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (the update is scaled by alpha / r).")
    lora_target_modules: list[str] | None = Field(None, description="Module names that get adapters; null = peft's "
                                                  "default for the architecture (GPT-2: c_attn).")
    max_refused_iterations: int = Field(3, ge=1, description="Fail the stage after this many iterations in a row "
                                        "whose every update step was refused for a non-finite loss or gradient.")
    sample_every: int = Field(10, ge=1, description="Log a table of sample responses every N iterations.")
    eval_every: int | None = Field(None, ge=1, description="Every N iterations (and after the last), sample the "
                                   "policy on ppo.eval_prompts held-out prompts and log heldout/* (RM reward, gold "
                                   "where the task has a judge, KL to the reference, length); null = off.")
    eval_prompts: int = Field(32, ge=1, description="Held-out prompts of the evaluation during PPO: the first ones "
                              "of the eval stage's prompts, with the same seeded draws at every evaluation.")
    keep: Literal["final", "best"] = Field("final", description="The policy saved and registered: the final one, or "
                                           "(with ppo.eval_every) the one of the evaluation with the best held-out "
                                           "figure (gold, else RM reward), named in the PPO run's rlhf.kept tag.")
    checkpoint_every: int = Field(10, ge=1, description="Log a checkpoint (weights, optimizer, RNG, KL state) every "
                                  "N iterations, and after the last one.")
    keep_checkpoints: int | None = Field(2, ge=1, description="Checkpoints kept (locally and in the MLflow run); "
                                         "older ones are deleted once a newer one is logged. Null = keep all.")
    seed: int = Field(0, description="Seed of prompt order and sampling.")
    alarm_kl_factor: float = Field(4.0, gt=0, description="KL blow-up alarm: KL above this many times target_kl.")
    alarm_entropy_min: float = Field(0.05, ge=0, description="Entropy-collapse alarm: mean token entropy below this.")
    alarm_explained_variance_min: float = Field(
        0.1, description="Critic-lag alarm: the mean explained variance over the last `alarm_critic_window` "
        "iterations below this, after the warm-up."
    )
    alarm_critic_window: int = Field(5, ge=1, description="Critic-lag alarm: iterations whose mean explained "
                                     "variance is compared with alarm_explained_variance_min (1 = each iteration "
                                     "alone).")
    alarm_length_frac: float = Field(0.95, gt=0, le=1, description="Length-explosion alarm: mean length above this "
                                     "fraction of max_new_tokens (or over half the responses without EOS).")
    alarm_window: int = Field(5, ge=2, description="Iterations over which reward hacking (RM up, gold or length "
                              "diverging) is judged.")
    alarm_min_change: float = Field(0.05, ge=0, description="Reward hacking: the least trend (change over the "
                                    "window) in RM and gold score that counts as rising or falling.")
    alarm_z: float = Field(3.0, ge=0, description="Reward hacking: a trend counts only beyond this many standard "
                           "errors of it, from the sampling noise of each iteration's mean (0 = alarm_min_change "
                           "alone).")
    alarm_after: int = Field(5, ge=0, description="Warm-up iterations before the entropy and critic alarms apply.")
    stop_on_alarm: bool = Field(False, description="End the PPO loop cleanly at the first alarm; the policy of the "
                                "last completed iteration is registered.")
    require_rm_edge: bool = Field(False, description="Refuse to start PPO when the reward model does not beat the "
                                  "policy's zero-shot log-likelihood on its held-out pairs (the reward stage's "
                                  "rm_no_edge alarm, reward.baselines): PPO would optimise a reward that ranks no "
                                  "better than what the policy already prefers. Off: the alarm is a warning.")
    rollout_engine: Annotated[Literal["hf", "compiled", "vllm"], AfterValidator(require_engine)] = Field(
        "hf", description="Rollout generator: hf (our sampling loop, one eager model call per token, log-probs from "
        "the sampling step), compiled (the same loop with its decode step compiled on a static KV cache: inductor on "
        "a CPU, CUDA graphs on a GPU; prompt widths rounded up to a multiple of 64 so a run compiles a few shapes, "
        "the compile seconds logged as time/compile_s; the eval samples with it too; multi-turn episodes stay eager) "
        "or vllm (GPU only, the `vllm` extra; weights synced after each update, log-probs recomputed by the policy).")
    async_rollouts: AsyncRolloutsConfig = Field(
        default_factory=AsyncRolloutsConfig, description="One-step-off-policy rollouts: sample the next iteration's "
        "rollout while this one updates, corrected by truncated importance weights (`staleness` 0: the synchronous "
        "loop).")

    @model_validator(mode="after")
    def _sizes_divide(self) -> "PPOConfig":
        mb = self.batch_size // self.minibatches
        checks = [
            (self.batch_size % self.minibatches, f"ppo.batch_size ({self.batch_size}) must be divisible by "
                                                 f"ppo.minibatches ({self.minibatches})"),
            (mb % self.gradient_accumulation_steps, f"the minibatch (ppo.batch_size / ppo.minibatches = {mb}) must "
             f"be divisible by ppo.gradient_accumulation_steps ({self.gradient_accumulation_steps})"),
            (self.advantage_estimator != "gae" and self.batch_size % self.group_size,
             f"ppo.batch_size ({self.batch_size}) must be divisible by ppo.group_size ({self.group_size}) "
             f"with ppo.advantage_estimator={self.advantage_estimator}"),
        ]
        check_rewards(self.rewards)
        has_env_source = any(r.kind == "environment" for r in self.rewards)
        checks += [
            (has_env_source and self.environment is None,
             "ppo.rewards: a source of kind environment needs ppo.environment (the environment that gives it)"),
            (self.environment is not None and not has_env_source,
             f"ppo.environment={self.environment!r}: add its reward to ppo.rewards ({{name: env, kind: environment}}"
             "): without it the environment's rewards would be dropped"),
            (self.environment is None and self.max_turns > 1,
             f"ppo.max_turns={self.max_turns} needs ppo.environment: without one an episode is one reply"),
            (self.environment is not None and self.rollout_engine == "vllm",
             "ppo.environment: multi-turn rollouts run on rollout_engine 'hf' only"),
            (self.async_rollouts.staleness and self.environment is not None,
             "ppo.async_rollouts.staleness > 0 samples single replies: multi-turn episodes (ppo.environment) run "
             "synchronously (staleness 0)"),
            (self.async_rollouts.staleness and self.rollout_engine == "vllm",
             "ppo.async_rollouts.staleness > 0 samples with a copy of the policy in a thread (rollout_engine hf or "
             "compiled); vLLM keeps its own weights: use staleness 0 with it"),
        ]
        checks.append((self.rm_unit_std and not self.rm_offset_samples,
                       "ppo.rm_unit_std needs ppo.rm_offset_samples > 0: the SFT samples whose score std it "
                       "divides by"))
        checks.append((self.keep == "best" and self.eval_every is None,
                       "ppo.keep=best needs ppo.eval_every: the best policy is chosen at the held-out evaluations"))
        for bad, message in checks:
            if bad:
                raise ValueError(message)
        return self

    @property
    def reward_model(self) -> RewardSource | None:
        """The source of kind model, if any: PPO then loads a frozen reward model."""
        return next((r for r in self.rewards if r.kind == "model"), None)

    def key(self) -> dict:
        """The config as the PPO stage's cache key reads it: without the multi-turn keys when there is no
        environment, so a single-turn run's key is what it was before they existed."""
        drop = {"environment", "max_turns", "max_episode_tokens"} if self.environment is None else set()
        if self.reward_control == "none":  # a run's key is what it was before control arms existed
            drop.add("reward_control")
        if not self.async_rollouts.staleness:  # the synchronous loop's key is what it was before async rollouts
            drop.add("async_rollouts")
        return self.model_dump(exclude=drop or None)

    @property
    def response_tokens(self) -> int:
        """The longest response a rollout can hold: max_new_tokens, or a multi-turn episode's budget (policy and
        environment tokens); the prompt gets what is left of the model's positions."""
        return self.episode_tokens if self.environment else self.max_new_tokens

    @property
    def policy_tokens(self) -> int:
        """The most tokens the policy itself can write in one response (the length alarm's ceiling)."""
        return self.max_turns * self.max_new_tokens if self.environment else self.max_new_tokens

    @property
    def episode_tokens(self) -> int:
        """The response budget of one episode (ppo.max_episode_tokens, or max_turns x max_new_tokens)."""
        return self.max_episode_tokens or self.max_turns * self.max_new_tokens

    @property
    def has_critic(self) -> bool:
        """Whether a value function is trained: only GAE needs one."""
        return self.advantage_estimator == "gae"
