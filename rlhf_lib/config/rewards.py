"""Config of PPO's reward sources (`ppo.rewards`): the trained reward model, a judge language model, Python functions
and HTTP endpoints, summed with weights into the score on the last real token."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from rlhf_lib.config.base import Section
from rlhf_lib.redaction import redact_text

_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class RewardSource(Section):
    """One reward source. Its raw score is logged as `objective/score/<name>` and, times `weight`, summed with the
    others into the score that goes on the last real token (the RM offset, whitening and clipping then apply to
    that sum)."""

    name: str = Field(description="Name of the source in the metrics and the report (letters, digits, _ . -).")
    kind: Literal["model", "judge", "function", "http", "environment"] = Field(
        description="model: a trained reward model; judge: a causal language model grading each reply from its "
        "next-token probabilities (rlhf_lib/rewards/judge.py); function: a Python callable on decoded text; http: a "
        "reward endpoint (the protocol of `rlhf serve-reward`); environment: the sum of ppo.environment's rewards "
        "over the episode.")
    weight: float = Field(1.0, description="Weight of this source in the summed score.")
    model: str | None = Field(None, description="kind model: an MLflow model URI (models:/rlhf-reward@champion, "
                              "models:/rlhf-reward/3, runs:/<id>/model) used instead of the reward stage's RM; "
                              "null = the reward stage's RM (the reward stage runs). kind judge: the judge, a hub "
                              "id, a local folder, a .gguf file or a known name (smollm2), or an MLflow model URI.")
    template: str | None = Field(None, description="kind judge: the rubric, with the placeholders {prompt} and "
                                 "{response}; sent as the user's message through the judge's chat template (plain "
                                 "text without one). It must ask for a Yes/No answer (score yes_probability) or a "
                                 "rating from 1 to rating_max (score rating).")
    score: Literal["yes_probability", "rating"] = Field("yes_probability", description="kind judge: the score read "
                                                        "from the judge's next-token distribution: P(Yes) / (P(Yes) "
                                                        "+ P(No)), or the expected rating over the tokens 1..rating_max "
                                                        "(renormalised over them); never from generated text.")
    rating_max: int = Field(5, ge=2, le=9, description="kind judge, score rating: the highest rating (each of "
                            "1..rating_max must be one token of the judge's tokenizer).")
    max_length: int = Field(1024, ge=16, description="kind judge: longest rubric in tokens; a longer one loses the "
                            "start of the prompt first.")
    function: str | None = Field(None, description="kind function: `package.module:function`, called as "
                                 "fn(prompts, completions, finished=..., **columns, **params) -> one float per row; "
                                 "built-in: rlhf_lib.rewards.builtin:exact_match, length_target, required_format.")
    params: dict[str, Any] = Field(default_factory=dict, description="kind function: keyword arguments passed "
                                   "to the function on every call (e.g. {target: 20} for length_target).")
    url: str | None = Field(None, description="kind http: the scoring URL (POST), e.g. http://127.0.0.1:8765/score; "
                            "`${VAR}` in it is read from the environment at each call (keys stay out of the config).")
    version: str | None = Field(None, description="kind http: a version string of what the endpoint serves; part "
                                "of the PPO cache key (the endpoint's answers cannot be hashed).")
    token_env: str | None = Field(None, description="kind http: environment variable holding the bearer token "
                                  "(the token itself never enters the config, the logs or the cache key).")
    timeout_s: float = Field(30.0, gt=0, description="kind http: seconds one try may take, from sending the request "
                             "to the last byte of the answer; kind function: seconds one call on a batch may take "
                             "(past it the iteration fails with one line).")
    retries: int = Field(3, ge=1, description="kind http: tries per request (exponential backoff) on timeouts, "
                         "connection errors and HTTP 5xx/429; a 4xx is not retried.")
    verify_tls: bool = Field(True, description="kind http: verify the server's TLS certificate.")
    batch_size: int | None = Field(None, ge=1, description="kind http: rows per request; kind judge: rubrics per "
                                   "forward pass; null = the whole batch (http), 8 (judge).")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> "RewardSource":
        where = f"ppo.rewards[{self.name!r}]"
        if not _NAME.match(self.name):
            raise ValueError(f"{where}.name: use letters, digits, '_', '.' or '-' (it names metrics)")
        needs = {"function": "function", "http": "url", "judge": "template"}
        judge_keys = {"model", "template", "score", "rating_max", "max_length", "batch_size"}
        own = {"model": {"model"}, "judge": judge_keys, "function": {"function", "params", "timeout_s"},
               "http": {"url", "version", "token_env", "timeout_s", "retries", "verify_tls", "batch_size"},
               "environment": set()}
        if self.kind in needs and getattr(self, needs[self.kind]) is None:
            raise ValueError(f"{where}: kind {self.kind} needs {needs[self.kind]}")
        others = set().union(*(keys for kind, keys in own.items() if kind != self.kind)) - own[self.kind]
        # A value other than the default, not a key that is merely present: a dumped config names every key.
        defaults = {k: f.get_default(call_default_factory=True) for k, f in type(self).model_fields.items()}
        if stray := sorted(k for k in others if getattr(self, k) != defaults[k]):
            raise ValueError(f"{where}: {', '.join(stray)} does not apply to kind {self.kind}")
        if self.kind == "judge":
            if not self.model:
                raise ValueError(f"{where}: kind judge needs model (the judge language model)")
            if missing := [p for p in ("{prompt}", "{response}") if p not in self.template]:
                raise ValueError(f"{where}.template: lacks the placeholder(s) {', '.join(missing)}")
        if self.function is not None and not _FUNCTION.match(self.function):
            raise ValueError(f"{where}.function: expected package.module:function, got {self.function!r}")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{where}.url: expected an http:// or https:// URL with a host, got {self.url!r}")
        if self.token_env is not None and not re.match(r"^[A-Za-z_]\w*$", self.token_env):
            raise ValueError(f"{where}.token_env: {self.token_env!r} is not an environment variable name")
        return self

    def describe(self) -> str:
        """How errors name the source: `reward 'len' (function mypkg.rewards:length)`."""
        what = {"model": self.model or "the reward stage's model", "judge": self.model, "function": self.function,
                "http": self.url, "environment": "ppo.environment"}
        return redact_text(f"reward {self.name!r} ({self.kind} {what[self.kind]})")


def default_rewards() -> list[RewardSource]:
    return [RewardSource(name="rm", kind="model")]


def check_rewards(rewards: list[RewardSource]) -> None:
    """At least one source, distinct names, at most one reward model (PPO's fourth model)."""
    if not rewards:
        raise ValueError("ppo.rewards is empty: give at least one reward source")
    names = [r.name for r in rewards]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"ppo.rewards: duplicate name(s) {dup}")
    if sum(r.kind == "model" for r in rewards) > 1:
        raise ValueError("ppo.rewards: at most one source of kind model (PPO holds one frozen reward model); "
                         "serve another one with `rlhf serve-reward` and add it as kind http")
