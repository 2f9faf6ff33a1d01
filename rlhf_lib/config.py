"""Typed configuration: one pydantic model per stage, nested in `PipelineConfig`.

Every field has a description (it is the help text in the Prefect UI form and in the README). Unknown keys and
wrong types are errors: `extra="forbid"` plus pydantic's strict-enough coercion. Derived sizes (minibatch size,
number of pairs per ranked list, ...) are computed where they are used, never set here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from rlhf_lib.ppo.vllm_engine import require_engine


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# Our column names that a `data.*_columns` mapping may point at the user's columns.
COLUMN_NAMES = {
    "preferences_columns": ("prompt", "chosen", "rejected", "responses", "ranking", "scores"),
    "sft_columns": ("prompt", "completion", "response", "messages", "text"),
    "prompts_columns": ("prompt",),
}


class DataConfig(_Section):
    """The built-in demo task (see data/README.md); paths override it with user data."""

    seed: int = Field(0, description="Seed of the demo task generator: same seed, same data, byte for byte.")
    n_train_prompts: int = Field(512, ge=8, description="Training prompts (SFT, reward model and PPO draw from them).")
    n_eval_prompts: int = Field(64, ge=4, description="Held-out prompts, from slot combinations never seen in training.")
    sft_per_prompt: int = Field(2, ge=1, description="SFT demonstrations per training prompt.")
    ranked_per_prompt: int = Field(1, ge=1, description="Ranked lists per training prompt for the reward model.")
    responses_per_list: int = Field(4, ge=2, description="K: responses per ranked list (K(K-1)/2 pairs each).")
    rank_noise: float = Field(
        0.5, ge=0.0, description="Bradley-Terry noise of the labeller: Gumbel scale added to the gold score "
        "before ranking (0 = the gold order exactly).",
    )
    eval_pairs_per_prompt: int = Field(2, ge=1, description="Noise-free held-out pairs per eval prompt (RM accuracy).")
    # User data (README "Your own data and models"): a source is a local file (.jsonl, .json, .csv, .parquet), a
    # local directory of data files, or a hub data set name, read through `datasets`.
    preferences: str | None = Field(None, description="Preference data (pairs or ranked lists): file, directory or "
                                    "hub data set. null = the demo task.")
    sft: str | None = Field(None, description="SFT demonstrations; null = the best response of each training "
                            "preference.")
    prompts: str | None = Field(None, description="PPO training prompts; null = the prompts of the training "
                                "preferences.")
    eval_preferences: str | None = Field(None, description="Held-out preference data (RM accuracy, eval prompts); "
                                         "null = a seeded data.eval_fraction split of data.preferences.")
    eval_prompts: str | None = Field(None, description="Held-out prompts of the eval stage; null = the prompts of "
                                     "the held-out preferences.")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="Share of the distinct preference prompts held out "
                                 "(seeded by data.seed) when data.eval_preferences is null.")
    preferences_format: Literal["auto", "hh", "standard", "conversational", "ranked", "scored"] = Field(
        "auto", description="Format of the preference rows; auto detects it from the first row's columns.")
    sft_format: Literal["auto", "prompt_completion", "messages", "text"] = Field(
        "auto", description="Format of the SFT rows; auto detects it from the first row's columns.")
    preferences_columns: dict[str, str] = Field(
        default_factory=dict, description="Column mapping of the preference sources: our name -> your column, "
        "e.g. {prompt: question, chosen: response_j}.")
    sft_columns: dict[str, str] = Field(default_factory=dict, description="Column mapping of data.sft.")
    prompts_columns: dict[str, str] = Field(default_factory=dict, description="Column mapping of the prompt "
                                            "sources (data.prompts, data.eval_prompts).")
    on_bad_row: Literal["error", "skip"] = Field("error", description="A bad row of user data: fail naming file, "
                                                 "line and field, or skip it and log the count and reasons.")
    max_row_chars: int = Field(20000, ge=100, description="A user row with more characters of text is a bad row.")
    split: str = Field("train", description="Split read from a hub data set or directory (training sources).")
    eval_split: str = Field("test", description="Split read from a hub data set or directory for "
                            "data.eval_preferences and data.eval_prompts.")
    hub_data_dir: str | None = Field(None, description="data_dir of hub data sets (e.g. harmless-base of "
                                     "Anthropic/hh-rlhf).")
    hub_revision: str | None = Field(None, description="Git revision of hub data sets; pin it for reproducible "
                                     "data.")

    @property
    def user_data(self) -> bool:
        """Whether the pipeline runs on user data rather than the demo task."""
        return self.preferences is not None

    @model_validator(mode="after")
    def _sources_need_preferences(self) -> "DataConfig":
        extra = [k for k in ("sft", "prompts", "eval_preferences", "eval_prompts") if getattr(self, k)]
        if extra and not self.preferences:
            raise ValueError(f"data.{extra[0]} needs data.preferences: the reward model trains on preference data "
                             "(null preferences = the demo task)")
        return self

    @model_validator(mode="after")
    def _known_columns(self) -> "DataConfig":
        for key, names in COLUMN_NAMES.items():
            if unknown := sorted(set(getattr(self, key)) - set(names)):
                raise ValueError(f"data.{key}: unknown column name(s) {unknown}; expected some of {list(names)}")
        return self


class ModelConfig(_Section):
    """The policy architecture: a hub name / local directory, or sizes for a fresh GPT-2."""

    name_or_path: str | None = Field(
        None, description="Hub name or local directory loaded with from_pretrained; null builds a fresh model.",
    )
    revision: str | None = Field(None, description="Git revision of a hub model (commit, tag or branch).")
    trust_remote_code: bool = Field(False, description="Let from_pretrained run the model's own Python code; only "
                                    "for a source you trust.")
    vocab_size: int = Field(512, ge=64, description="Size of the BPE tokenizer trained on the task's texts (fresh "
                            "models only).")
    n_layer: int = Field(2, ge=1, description="Transformer blocks of a fresh model.")
    n_head: int = Field(4, ge=1, description="Attention heads of a fresh model.")
    n_embd: int = Field(128, ge=8, description="Hidden size of a fresh model (divisible by n_head).")
    n_positions: int = Field(128, ge=16, description="Longest sequence (prompt + response) fed to the model: a fresh "
                             "model's position table; a loaded model is also capped at its own context.")
    seed: int = Field(0, description="Seed of the fresh model's initialisation.")

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        return self


class SFTConfig(_Section):
    epochs: int = Field(3, ge=1, description="Passes over the demonstrations.")
    batch_size: int = Field(32, ge=1, description="Demonstrations per optimizer step.")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate (linear decay to 0 after a 5% warm-up).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_length: int = Field(96, ge=8, description="Longest prompt + response in tokens; longer rows are cut.")
    seed: int = Field(0, description="Seed of data order.")


class RewardConfig(_Section):
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


class PPOConfig(_Section):
    iterations: int = Field(40, ge=1, description="Rollout/update iterations.")
    batch_size: int = Field(64, ge=1, description="Prompts per rollout.")
    max_new_tokens: int = Field(32, ge=1, description="Longest response; sampling stops early at EOS.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature; the same one divides logits in every log-prob.")
    epochs: int = Field(4, ge=1, description="PPO epochs over each rollout.")
    minibatches: int = Field(4, ge=1, description="Minibatches per epoch (batch_size must divide evenly).")
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
    checkpoint_every: int = Field(10, ge=1, description="Log a checkpoint (weights, optimizer, RNG, KL state) every "
                                  "N iterations, and after the last one.")
    seed: int = Field(0, description="Seed of prompt order and sampling.")
    alarm_kl_factor: float = Field(4.0, gt=0, description="KL blow-up alarm: KL above this many times target_kl.")
    alarm_entropy_min: float = Field(0.05, ge=0, description="Entropy-collapse alarm: mean token entropy below this.")
    alarm_explained_variance_min: float = Field(
        0.0, description="Critic-lag alarm: explained variance below this after the warm-up."
    )
    alarm_length_frac: float = Field(0.95, gt=0, le=1, description="Length-explosion alarm: mean length above this "
                                     "fraction of max_new_tokens (or over half the responses without EOS).")
    alarm_window: int = Field(5, ge=2, description="Iterations over which reward hacking (RM up, gold or length "
                              "diverging) is judged.")
    alarm_min_change: float = Field(0.05, ge=0, description="Reward hacking: the least trend (change over the "
                                    "window) in RM and gold score that counts as rising or falling.")
    alarm_after: int = Field(5, ge=0, description="Warm-up iterations before the entropy and critic alarms apply.")
    stop_on_alarm: bool = Field(False, description="End the PPO loop cleanly at the first alarm; the policy of the "
                                "last completed iteration is registered.")
    rollout_engine: Annotated[Literal["hf", "vllm"], AfterValidator(require_engine)] = Field(
        "hf", description="Rollout generator: hf (our sampling loop, log-probs from the sampling step) or vllm "
        "(GPU only, the `vllm` extra; weights synced after each update, log-probs recomputed by the policy).")

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
        for bad, message in checks:
            if bad:
                raise ValueError(message)
        return self

    @property
    def has_critic(self) -> bool:
        """Whether a value function is trained: only GAE needs one."""
        return self.advantage_estimator == "gae"


class EvalConfig(_Section):
    max_new_tokens: int = Field(32, ge=1, description="Longest response sampled on held-out prompts.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature of SFT and policy on held-out prompts.")
    samples_in_report: int = Field(16, ge=0, description="Rows in the report's sample table.")
    seed: int = Field(1234, description="Seed of held-out sampling (the same for SFT and policy).")


class ResourcesConfig(_Section):
    """How the supervised stages (SFT, reward model) train: processes, Accelerate config, precision."""

    num_processes: int = Field(1, ge=1, description="Training processes of SFT and RM. 1 trains in the stage's own "
                               "process; more launch `accelerate launch` (one process per GPU, or gloo CPU processes).")
    accelerate_config: str | None = Field(
        None, description="Accelerate config file (DDP, FSDP, DeepSpeed) used when num_processes > 1; a relative "
        "path is looked up in the working directory, then in the project's configs/accelerate/. Null: ddp.yaml "
        "with a GPU, cpu_gloo.yaml without.")
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="Autocast precision of SFT and RM training (fp16 needs a GPU); weights stay float32.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass of SFT "
                                         "and RM training: less memory, one more forward pass per step.")


class PipelineConfig(_Section):
    """The whole pipeline: the Prefect flow's parameter and the CLI's config."""

    name: str = Field("demo", description="Run name; shows in Prefect flow-run names and MLflow run names.")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    torch_threads: int = Field(2, ge=1, description="torch intra-op threads, set once per process.")

    @model_validator(mode="after")
    def _room_for_prompts(self) -> "PipelineConfig":
        # Prompt + response must fit the position embeddings; leave at least 8 tokens of prompt.
        for section in ("ppo", "eval"):
            new = getattr(self, section).max_new_tokens
            if new > self.model.n_positions - 8:
                raise ValueError(f"{section}.max_new_tokens ({new}) leaves no room for the prompt in "
                                 f"model.n_positions ({self.model.n_positions}); keep it <= n_positions - 8")
        return self


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `tree["a"]["b"] = value` for `dotted == "a.b"`, creating sub-dicts as needed."""
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ValueError(f"config key {'.'.join(keys[:-1])!r} is a value, not a section")
        node = child
    node[keys[-1]] = value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; `override` wins. Neither input is modified."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


class ConfigError(ValueError):
    """A config that cannot be used; the message names each bad key and what it expected."""


def _format_errors(err: Any, origin: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{origin}: unknown config key '{key}'")
        else:
            lines.append(f"{origin}: config key '{key}': {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def build_config(layers: list[tuple[str, dict[str, Any]]], sets: list[str] = ()) -> PipelineConfig:
    """Merge config layers (e.g. preset, then file) and `key=value` overrides, then validate.

    Each layer is (origin, dict); the origin names the file in errors. Values of `--set` are parsed as YAML
    scalars, so `ppo.kl_coef=0.1` is a float and `ppo.adaptive_kl=false` a bool.
    """
    import yaml
    from pydantic import ValidationError

    merged: dict[str, Any] = {}
    for origin, layer in layers:
        if not isinstance(layer, dict):
            raise ConfigError(f"{origin}: expected a mapping of config keys, got {type(layer).__name__}")
        merged = deep_merge(merged, layer)
        try:
            PipelineConfig.model_validate(merged)
        except ValidationError as e:
            raise ConfigError(_format_errors(e, origin)) from None
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. ppo.kl_coef=0.1")
        try:
            set_dotted(merged, key.strip(), yaml.safe_load(raw) if raw.strip() else raw)
        except ValueError as e:
            raise ConfigError(f"--set {item!r}: {e}") from None
    try:
        return PipelineConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, "--set" if sets else "config")) from None
