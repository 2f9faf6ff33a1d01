"""The score PPO optimises: the weighted sum of its reward sources (`ppo.rewards`), per row.

    score_i = sum_k w_k * s_k(prompt_i, response_i)

The reward model (kind model) reads token ids, on the device, `batch_size` rows per forward pass; the text sources
(judges, functions, HTTP endpoints) read the decoded prompt and completion with the prompt's extra columns, once per
batch; in a multi-turn rollout the completion they read is the policy's last turn, and the source of kind
environment is the sum of the environment's rewards over the episode (docs/environments.md).
Each source's raw score is kept (`Scores.parts`) for the metrics; the RM offset, EOS penalty, whitening and clipping
of `rlhf_lib.ppo.shaping` then apply to the sum.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rlhf_lib.config.rewards import RewardSource
from rlhf_lib.intervals import standard_error
from rlhf_lib.lm.generation import decode_responses, ends_with_eos
from rlhf_lib.rewards.base import RewardError, TextBatch, TextReward, check_scores

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlhf_lib.rewards.retokenize import RewardScorer


@dataclass
class Scores:
    """total: (B,) float32, the weighted sum; parts: each source's raw (B,) float32 score, by source name; seconds:
    each source's wall time on this batch (the cost of a judge or an endpoint beside the RM's)."""

    total: torch.Tensor
    parts: dict[str, torch.Tensor]
    seconds: dict[str, float] = field(default_factory=dict)


def build_text_rewards(sources: Sequence[RewardSource]) -> dict[str, TextReward]:
    """The function and HTTP sources as callables on a `TextBatch`, by name; an import failure names the source."""
    from rlhf_lib.rewards.functions import FunctionReward

    out: dict[str, TextReward] = {}
    for s in sources:
        if s.kind == "function":
            out[s.name] = FunctionReward(s.function, s.params, s.describe(), timeout_s=s.timeout_s)
        elif s.kind == "http":
            from rlhf_lib.rewards.http import HttpReward

            out[s.name] = HttpReward(s.name, s.url, token_env=s.token_env, timeout_s=s.timeout_s, retries=s.retries,
                                     verify_tls=s.verify_tls, batch_size=s.batch_size)
    return out


class RewardSet:
    """The reward sources of one PPO run (or eval). `rm`: the frozen reward model's scorer, None when no source is
    of kind model; `columns`: the extra fields of each prompt (e.g. `answer`), by prompt text."""

    def __init__(self, sources: Sequence[RewardSource], rm: RewardScorer | None, tokenizer: PreTrainedTokenizerBase,
                 columns: Mapping[str, Mapping[str, Any]] | None = None, batch_size: int = 16,
                 text: Mapping[str, TextReward] | None = None, judges: Mapping[str, TextReward] | None = None):
        model = [s for s in sources if s.kind == "model"]
        if model and rm is None:
            raise ValueError(f"{model[0].describe()}: no reward model was loaded")
        judges = dict(judges or {})
        if missing := [s for s in sources if s.kind == "judge" and s.name not in judges]:
            raise ValueError(f"{missing[0].describe()}: no judge model was loaded")
        self.sources, self.rm, self.tokenizer, self.batch_size = list(sources), rm, tokenizer, batch_size
        self.columns = dict(columns or {})
        self.names = sorted({k for row in self.columns.values() for k in row})
        self.text = (dict(text) if text is not None else build_text_rewards(self.sources)) | judges

    @property
    def weights(self) -> dict[str, float]:
        return {s.name: s.weight for s in self.sources}

    def text_batch(self, prompts: Sequence[str], response: torch.Tensor, response_mask: torch.Tensor,
                   completions: Sequence[str] | None = None) -> TextBatch:
        """The rows as text: completions without EOS or padding (or the given ones: a multi-turn rollout's last
        policy turns), whether each ended with EOS, the prompts' columns (None where a prompt has no such field)."""
        rows = [self.columns.get(p, {}) for p in prompts]
        finished = ends_with_eos(response, response_mask, self.tokenizer.eos_token_id).tolist()
        texts = list(completions) if completions is not None else decode_responses(self.tokenizer, response,
                                                                                   response_mask)
        return TextBatch(list(prompts), texts, finished, {name: [row.get(name) for row in rows] for name in self.names})

    @torch.inference_mode()
    def __call__(self, prompts: Sequence[str], query: torch.Tensor, query_mask: torch.Tensor, response: torch.Tensor,
                 response_mask: torch.Tensor, env_returns: torch.Tensor | None = None,
                 completions: Sequence[str] | None = None) -> Scores:
        """Shapes: query, query_mask (B, P); response, response_mask (B, R); env_returns (B,) (multi-turn: the
        environment's summed rewards); completions: B texts the text sources read instead of the decoded
        response (multi-turn: the last policy turns); B prompts -> Scores of (B,)."""
        n, parts = query.shape[0], {}
        if len(prompts) != n:
            raise RewardError(f"reward sources: {len(prompts)} prompt texts for {n} rows")
        batch = self.text_batch(prompts, response, response_mask, completions) if self.text else None
        seconds = {}
        for s in self.sources:
            t0 = time.perf_counter()
            if s.kind == "environment":
                if env_returns is None:
                    raise RewardError(f"{s.describe()}: this rollout ran without an environment")
                parts[s.name] = env_returns.to(device=response.device, dtype=torch.float32)
            elif s.kind == "model":
                b = self.batch_size
                parts[s.name] = torch.cat([self.rm(query[i : i + b], query_mask[i : i + b], response[i : i + b],
                                                   response_mask[i : i + b]).float() for i in range(0, n, b)])
            else:
                values = check_scores(self.text[s.name](batch), n, s.describe())
                parts[s.name] = torch.tensor(values, dtype=torch.float32, device=response.device)
            if parts[s.name].is_cuda:
                torch.cuda.synchronize(parts[s.name].device)  # the kernels' time, not their launch's
            seconds[s.name] = time.perf_counter() - t0
        total = sum((s.weight * parts[s.name] for s in self.sources), torch.zeros(n, device=response.device))
        return Scores(total, parts, seconds)


def part_stats(parts: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> dict[str, float]:
    """`objective/score/<name>` (the source's raw mean) and `objective/score/<name>_weighted` (times its weight).
    Shapes: each part (B,)."""
    out = {}
    for name, values in parts.items():
        mean = float(values.float().mean())
        out[f"objective/score/{name}"] = mean
        out[f"objective/score/{name}_weighted"] = weights[name] * mean
        out[f"objective/score/{name}_sem"] = standard_error(values.float().tolist())
    return out
