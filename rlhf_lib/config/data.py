"""Config of the data and of the policy model: a built-in task (demo or arithmetic), or user data sets and
pretrained models."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlhf_lib.config.base import Section

COLUMN_NAMES = {
    "preferences_columns": ("prompt", "chosen", "rejected", "responses", "ranking", "scores", "category"),
    "sft_columns": ("prompt", "completion", "response", "messages", "text"),
    "prompts_columns": ("prompt",),
}
# 1 right answer + 6 distinct wrong ones (off by 1, 2 or 10 either way): the most a ranked arithmetic list can hold.
# rlhf_lib/arith_task/answers.py draws from these offsets; its tests check the two agree.
ARITH_MAX_RESPONSES = 7


class DataConfig(Section):
    """A built-in task (demo or arithmetic, see docs/data.md); paths override it with user data."""

    task: Literal["demo", "arithmetic"] = Field(
        "demo", description="Built-in task when no user data is set: demo (advice prompts, a hidden gold judge) or "
        "arithmetic (\"What is 37 + 48?\", a verifiable answer for the exact-match reward).")
    seed: int = Field(0, description="Seed of the built-in task generator: same seed, same data, byte for byte.")
    n_train_prompts: int = Field(512, ge=8, description="Training prompts (SFT, reward model and PPO draw from them).")
    n_eval_prompts: int = Field(64, ge=4, description="Held-out prompts, from slot combinations never seen in training.")
    sft_per_prompt: int = Field(2, ge=1, description="SFT demonstrations per training prompt.")
    ranked_per_prompt: int = Field(1, ge=1, description="Ranked lists per training prompt for the reward model.")
    responses_per_list: int = Field(4, ge=2, description="K: responses per ranked list (K(K-1)/2 pairs each).")
    topic_twins: int = Field(
        0, ge=0, description="Minimal pairs per ranked list: a response and its twin with the topic keyword swapped "
        "(on <-> off the prompt's topic), ranked like the others, so the prompt-topic match shows as a contrast. "
        "At most responses_per_list / 2.",
    )
    loop_twins: int = Field(
        0, ge=0, description="Minimal pairs per ranked list after the topic twins: a response with a word caught in "
        "a loop and the same response without it, so the loop shows as a contrast. 2 x (topic_twins + loop_twins) "
        "<= responses_per_list.",
    )
    rank_noise: float = Field(
        0.5, ge=0.0, description="Bradley-Terry noise of the labeller: Gumbel scale added to the gold score "
        "before ranking (0 = the gold order exactly).",
    )
    eval_pairs_per_prompt: int = Field(2, ge=1, description="Noise-free held-out pairs per eval prompt (RM accuracy).")
    heldout: Literal["test", "validation"] = Field(
        "test", description="Demo task and data.operands chain: the split the reports read (eval prompts, held-out and adversarial pairs). "
        "Choose settings with validation; report test once. Training files are the same either way.")
    adversarial_per_topic_pair: int = Field(
        5, ge=0, description="Demo task: adversarial topic swaps per (prompt topic, other topic) of the held-out "
        "split: the clean response against itself about the other topic.")
    adversarial_per_kind: int = Field(
        64, ge=0, description="Demo task: adversarial pairs of each other kind (loop, cut, stacked politeness, too "
        "many facts) against their clean twins.")
    sft_correct: float = Field(
        0.5, ge=0.0, le=1.0, description="Arithmetic task: share of SFT demonstrations whose answer is right; the "
        "others are plausibly wrong (off by 1 or 2, or a carry slip of 10), so SFT leaves headroom for RL.")
    operands: Literal["2+2", "2+1", "1+1", "chain"] = Field(
        "2+2", description="Arithmetic task: digits of the two operands, \"2+2\" (\"What is 37 + 48?\"), \"2+1\" "
        "(\"What is 47 + 6?\", 270 held-out problems) or \"1+1\" (\"What is 7 + 8?\", 25 held-out problems of 81: "
        "the unordered pairs {a, a + 3} and every sum of 10; rlhf_lib/arith_task/problems.py); or \"chain\": two to "
        "four two-digit numbers joined by + and - (\"What is 37 + 48 - 29?\"), one to three calls of the "
        "one-operation calculator (data.tool: calculator, ppo.environment: one_op_calculator; "
        "rlhf_lib/arith_task/chains.py).")
    sft_call_shares: list[Annotated[float, Field(ge=0.0, le=1.0)]] | None = Field(
        None, min_length=3, max_length=3, description="data.operands chain: the share of the training problems of "
        "one, two and three calls that get demonstrations, e.g. [1, 1, 0.05] (PPO's prompts and the eval still ask "
        "all three in equal shares): the room RL has to find. Null = every problem demonstrated.")
    instruction: str | None = Field(
        None, max_length=500, description="Arithmetic task: text after every question, e.g. \"Answer with the number "
        "only.\" (\"What is 7 + 8? Answer with the number only.\"). Null = the question alone.")
    tool: Literal["calculator"] | None = Field(
        None, description="Arithmetic task: demonstrations that call the calculator environment (\" <calc>37 + "
        "48</calc>\", then the answer after the tool's reply; docs/environments.md); pair with ppo.environment: "
        "calculator. Null = the answer directly.")
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
    max_rows: int | None = Field(None, ge=1, description="Read at most this many valid rows of each user data "
                                 "source (the first ones, in file order): a budget for a first run on a CPU. "
                                 "null = every row.")
    skip_rows: int = Field(0, ge=0, description="Leave out the first this many valid rows of each training source "
                           "(data.preferences, data.sft, data.prompts; held-out sources are read from their start), "
                           "before data.max_rows counts: a declared split of one file, e.g. a judge reward model on "
                           "rows the PPO reward model never saw (skip_rows: 640).")
    max_train_rows: int | None = Field(None, ge=1, description="Read at most this many valid rows of each training "
                                       "source (data.preferences, data.sft, data.prompts), after data.skip_rows; "
                                       "held-out sources keep data.max_rows alone: a learning curve over training "
                                       "rows scored on the same held-out pairs. The smaller of the two caps counts. "
                                       "null = data.max_rows.")
    render: Literal["auto", "chat_template", "text"] = Field(
        "auto", description="How user rows become the text the models read. auto: through the policy tokenizer's "
        "chat template when it has one (HH transcripts, conversational rows and plain prompts all become messages "
        "first), else as HH-style text; chat_template: the template, refused when there is none; text: never the "
        "template.")
    split: str = Field("train", description="Split read from a hub data set or directory (training sources).")
    eval_split: str = Field("test", description="Split read from a hub data set or directory for "
                            "data.eval_preferences and data.eval_prompts.")
    hub_data_dir: str | None = Field(None, description="data_dir of hub data sets (e.g. harmless-base of "
                                     "Anthropic/hh-rlhf).")
    hub_revision: str | None = Field(None, description="Git revision of hub data sets; pin it for reproducible "
                                     "data.")

    def key(self) -> dict:
        """The config as the data stage's cache key reads it: without `tool` and `instruction` when they are unset,
        `operands` when it is "2+2", `skip_rows` when it is 0 and `max_train_rows` when unset, so the key of a task without them is what it was
        before the keys existed."""
        drop = ({"tool"} if self.tool is None else set()) | ({"operands"} if self.operands == "2+2" else set())
        drop |= {"instruction"} if self.instruction is None else set()
        drop |= {"skip_rows"} if not self.skip_rows else set()
        drop |= {"max_train_rows"} if self.max_train_rows is None else set()
        drop |= {"sft_call_shares"} if self.sft_call_shares is None else set()
        return self.model_dump(exclude=drop or None)

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
        if self.skip_rows and not self.eval_preferences:
            raise ValueError("data.skip_rows needs data.eval_preferences: held-out pairs split off the kept rows would "
                             "differ from those of a run that skips none, so the two could not be compared")
        if self.max_train_rows is not None and not self.eval_preferences:
            raise ValueError("data.max_train_rows needs data.eval_preferences: held-out pairs split off the training "
                             "rows would shrink with the cap, and the points of a learning curve could not be compared")
        return self

    @model_validator(mode="after")
    def _arithmetic_is_built_in(self) -> "DataConfig":
        if self.tool is not None and self.task != "arithmetic":
            raise ValueError("data.tool: tool demonstrations are built for data.task=arithmetic only")
        if self.operands != "2+2" and self.task != "arithmetic":
            raise ValueError("data.operands: the operands of data.task=arithmetic only")
        if self.operands == "chain" and self.tool != "calculator":
            raise ValueError("data.operands chain: a chained problem is solved call by call; set data.tool: "
                             "calculator (and ppo.environment: one_op_calculator)")
        if self.sft_call_shares is not None and self.operands != "chain":
            raise ValueError("data.sft_call_shares: the demonstrations of data.operands chain only")
        if self.instruction is not None and self.task != "arithmetic":
            raise ValueError("data.instruction: the arithmetic task's questions only (user data carries its own "
                             "prompts)")
        if self.task == "arithmetic" and self.preferences is not None:
            raise ValueError("data.task=arithmetic builds its own data: unset data.preferences (user data), or use "
                             "data.task=demo")
        if self.task == "arithmetic" and self.responses_per_list > ARITH_MAX_RESPONSES:
            raise ValueError(f"data.responses_per_list ({self.responses_per_list}) must be <= {ARITH_MAX_RESPONSES} "
                             "with data.task=arithmetic: a list holds the right answer and distinct wrong ones (off "
                             "by 1, 2 or 10 either way)")
        return self

    @model_validator(mode="after")
    def _twins_fit_the_list(self) -> "DataConfig":
        if 2 * (self.topic_twins + self.loop_twins) > self.responses_per_list:
            raise ValueError(f"data.topic_twins ({self.topic_twins}) and data.loop_twins ({self.loop_twins}) need "
                             f"2 x (topic_twins + loop_twins) <= data.responses_per_list "
                             f"({self.responses_per_list}): a twin pair takes two places")
        return self

    @model_validator(mode="after")
    def _known_columns(self) -> "DataConfig":
        for key, names in COLUMN_NAMES.items():
            if unknown := sorted(set(getattr(self, key)) - set(names)):
                raise ValueError(f"data.{key}: unknown column name(s) {unknown}; expected some of {list(names)}")
        return self


class ModelConfig(Section):
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
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Weights dtype of the trained models (policy, value model, reward model) and so of "
        "Adam's state, whatever dtype the checkpoint was saved in. float32 learns at PPO's small learning rates; "
        "bfloat16 halves the memory but rounds away updates below ~1/256 of a weight; auto = the checkpoint's.")

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        return self
