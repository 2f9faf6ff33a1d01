"""Multi-turn rollouts: policy turns and environment turns interleaved in one token stream, with the mask that tells
them apart (docs/environments.md).

Per turn, every live row's context (prompt + everything so far) is left-padded and the policy samples up to
`max_new_tokens` (stopping at EOS); each row's environment reads the turn's text and answers; a row whose episode is
not over gets the observation's tokens appended (`ObservationFormat`) and goes on. An episode ends when the
environment says so, after `max_turns` policy turns, or when the next turn would pass `max_tokens` (the per-rollout
budget over policy and environment tokens). The last token of every row is the policy's: an observation is only
appended when another policy turn follows it.

Shapes: B rows, P prompt tokens, R response tokens (policy and environment, right-padded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlhf_lib.envs.base import Environment, Turn, safe_step
from rlhf_lib.envs.registry import load_environment
from rlhf_lib.envs.render import ObservationFormat, is_transcript
from rlhf_lib.lm.generation import sample

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.config import PPOConfig

# (context (b, C) left-padded, its mask, max_new_tokens) -> (new tokens (b, N) right-padded, their mask)
Generate = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Episodes:
    """response, response_mask, action_mask: (B, R); returns: (B,) the sum of the environment's rewards;
    turns: each row's turns as text."""

    response: torch.Tensor
    response_mask: torch.Tensor
    action_mask: torch.Tensor
    returns: torch.Tensor
    turns: list[list[Turn]]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def right_pad(rows: Sequence[Sequence[int]], value: int, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out.to(device)


def reset_all(factory: Callable[[], Environment], rows: Sequence[Mapping[str, Any]]) -> list[Environment]:
    """One fresh environment per row, reset from the row's fields."""
    envs = []
    for row in rows:
        env = factory()
        env.reset(row)
        envs.append(env)
    return envs


def run_episodes(generate: Generate, tokenizer: PreTrainedTokenizerBase, query: torch.Tensor,
                 query_mask: torch.Tensor, envs: Sequence[Environment], observations: ObservationFormat,
                 max_turns: int, max_new_tokens: int, max_tokens: int) -> Episodes:
    """Run one episode per row (see the module docstring). Shapes: query, query_mask (B, P) -> Episodes of (B, R)."""
    b, device = query.shape[0], query.device
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts = [q[m.bool()].tolist() for q, m in zip(query.cpu(), query_mask.cpu())]
    seq: list[list[int]] = [[] for _ in range(b)]
    act: list[list[int]] = [[] for _ in range(b)]
    returns = [0.0] * b
    turns: list[list[Turn]] = [[] for _ in range(b)]
    live = list(range(b))
    for turn in range(max_turns):
        room = [max_tokens - len(seq[i]) for i in live]
        ctx, ctx_mask = left_pad([prompts[i] + seq[i] for i in live], pad, device)
        new, new_mask = generate(ctx, ctx_mask, max(1, min(max_new_tokens, max(room))))
        going = []
        for j, i in enumerate(live):
            ids = new[j][new_mask[j].bool()].tolist()[: room[j]]
            seq[i] += ids
            act[i] += [1] * len(ids)
            text = tokenizer.decode([t for t in ids if t != eos], skip_special_tokens=True)
            step, failed = safe_step(envs[i], text)
            returns[i] += float(step.reward)
            turns[i].append(Turn("policy", text, float(step.reward), failed=failed))
            if step.done or step.observation is None or turn == max_turns - 1:
                continue
            obs = observations.ids(step.observation)
            if len(seq[i]) + len(obs) >= max_tokens:  # no room left for another policy token
                continue
            seq[i] += obs
            act[i] += [0] * len(obs)
            turns[i].append(Turn("environment", step.observation))
            going.append(i)
        live = going
        if not live:
            break
    response = right_pad(seq, pad, device)
    response_mask = right_pad([[1] * len(s) for s in seq], 0, device)
    action_mask = right_pad(act, 0, device)
    return Episodes(response, response_mask, action_mask, torch.tensor(returns, device=device), turns)


@dataclass
class EpisodeRunner:
    """Everything a multi-turn rollout needs besides the model: the environment (`ppo.environment`), the format of
    its observations, the turn and token limits, and the prompts' fields each environment is reset from (by prompt
    text). PPO's rollouts, its held-out evaluations and the eval stage all run episodes through one of these."""

    factory: Callable[[], Environment]
    tokenizer: PreTrainedTokenizerBase
    observations: ObservationFormat
    max_turns: int
    max_new_tokens: int
    max_tokens: int
    columns: Mapping[str, Mapping[str, Any]]

    @classmethod
    def build(cls, cfg: PPOConfig, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
              columns: Mapping[str, Mapping[str, Any]] | None,
              max_new_tokens: int | None = None) -> EpisodeRunner | None:
        """The runner of `cfg.environment` (None without one); `max_new_tokens` per turn (default ppo's)."""
        if cfg.environment is None:
            return None
        n = max_new_tokens or cfg.max_new_tokens
        return cls(load_environment(cfg.environment), tokenizer,
                   ObservationFormat(tokenizer, is_transcript(list(prompts)[:256])), cfg.max_turns, n,
                   cfg.max_episode_tokens or cfg.max_turns * n, dict(columns or {}))

    def __call__(self, model: PreTrainedModel, prompts: Sequence[str], query: torch.Tensor,
                 query_mask: torch.Tensor, temperature: float, generator: torch.Generator | None) -> Episodes:
        """One episode per prompt, each policy turn sampled from `model` at `temperature`.
        Shapes: query, query_mask (B, P) -> Episodes of (B, R)."""
        tok = self.tokenizer
        envs = reset_all(self.factory, [{"prompt": p, **self.columns.get(p, {})} for p in prompts])

        def generate(ctx: torch.Tensor, ctx_mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
            r, m, _ = sample(model, ctx, ctx_mask, max_new_tokens=n, temperature=temperature,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, generator=generator)
            return r, m

        return run_episodes(generate, tok, query, query_mask, envs, self.observations, self.max_turns,
                            self.max_new_tokens, self.max_tokens)
