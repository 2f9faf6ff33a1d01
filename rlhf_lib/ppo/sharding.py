"""PPO in W processes under `accelerate launch` (DDP), with the numbers of one process.

Every process builds the same trainer from the same seed, so the prompt sampler and the trainer's generator step
identically everywhere. Per phase, with a global rollout of B rows:

  1. generate   process r samples its contiguous slice of the B prompts (`ProcessGroup.local_rows`). Its random
                draws are its rows of the draws one process makes for the whole batch (`ProcessGroup.row_shard`),
                and every process runs the same number of token steps (until every row of every process is done),
                so the generator streams stay equal and the tokens are those of one process.
  2. score      reference log-probs, values and RM scores of the local rows: no communication.
     gather     the scored rows are all-gathered into the global rollout (`gather_rollout`), queries left-padded and
                responses right-padded to the widest, which is exactly the rollout one process would hold. It is
                small next to the models: (B, P + R) ids and a few (B, R) floats.
  3., 4.        KL-shaped rewards, the KL controller, reward whitening, GAE or group advantages, advantage whitening
                and every logged statistic run on the global rollout, identically in every process: one-process code,
                so beta, the running moments and whitening are global by construction and GRPO/RLOO groups whole.
  5. update     the epoch's permutation comes from the shared generator; process r computes the r-th contiguous
                slice of each minibatch's rows, its loss scaled by W, so that DDP's average of gradients is the
                one-process token mean (`backward_share`). Statistics, the NaN guard and the early stop read sums
                over processes, so every process takes the same decisions.

With one process every function here is the identity and the trainer runs its original code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from rlhf_lib.config import PPOConfig
from rlhf_lib.distributed import ProcessGroup

if TYPE_CHECKING:
    from rlhf_lib.ppo.critic import Critic
    from rlhf_lib.ppo.types import Rollout

# Rollout fields gathered after scoring, and what pads them: a query is left-padded, the rest right-padded.
_RESPONSE_FIELDS = ("response_mask", "action_mask", "logprobs", "ref_logprobs", "values")


def check_sizes(cfg: PPOConfig, world: int) -> None:
    """Refuse a PPO config that W processes cannot split evenly; errors name the keys. Nothing to check for W = 1."""
    if world == 1:
        return
    mb = cfg.batch_size // cfg.minibatches
    checks = [
        (mb % (world * cfg.gradient_accumulation_steps),
         (f"each minibatch (ppo.batch_size / ppo.minibatches = {mb} rows) is split over resources.num_processes "
          f"({world}), then into ppo.gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) micro-batches: "
          f"it must be divisible by {world * cfg.gradient_accumulation_steps}")),
        (cfg.rm_offset_samples % world,
         f"ppo.rm_offset_samples ({cfg.rm_offset_samples}) must be divisible by resources.num_processes ({world})"),
        (cfg.ptx_coef > 0 and cfg.ptx_batch_size % world,
         f"ppo.ptx_batch_size ({cfg.ptx_batch_size}) must be divisible by resources.num_processes ({world})"),
        (cfg.rollout_engine == "vllm", "ppo.rollout_engine=vllm runs in one process only (resources.num_processes=1)"),
    ]
    for bad, message in checks:
        if bad:
            raise ValueError(message)


def _padded(x: Tensor, width: int, pad: float, left: bool = False) -> Tensor:
    """`x` (n, w) padded to `width` columns with `pad`, on the left or the right. Shape: (n, width)."""
    fill = torch.full((x.shape[0], width - x.shape[1]), pad, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], 1)


def gather_rollout(ro: Rollout, pad_id: int, group: ProcessGroup) -> None:
    """Replace the local rows of a scored rollout by the global rollout (in place), padded as one process pads:
    queries with PAD on the left (mask 0), responses with PAD on the right (mask, log-probs and values 0)."""
    if group.world == 1:
        return
    p, r = group.max([ro.query.shape[1], ro.response.shape[1]])
    ro.query = group.gather(_padded(ro.query, p, pad_id, left=True))
    ro.query_mask = group.gather(_padded(ro.query_mask, p, 0, left=True))
    ro.response = group.gather(_padded(ro.response, r, pad_id))
    for name in _RESPONSE_FIELDS:
        if getattr(ro, name) is not None:
            setattr(ro, name, group.gather(_padded(getattr(ro, name), r, 0)))
    ro.raw_scores = group.gather(ro.raw_scores)
    if ro.env_returns is not None:
        ro.env_returns = group.gather(ro.env_returns)
    if ro.turns is not None:
        ro.turns = [t for part in group.gather_objects(ro.turns) for t in part]
    if ro.score_parts:
        ro.score_parts = {name: group.gather(v) for name, v in ro.score_parts.items()}
    ro.prompts = [p for part in group.gather_objects(ro.prompts) for p in part]


def prepare_models(group: ProcessGroup, policy: nn.Module, critic: Critic, optimizer: torch.optim.Optimizer,
                   frozen: Sequence[Any]) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Wrap the trained modules in DDP (the policy, and the critic's forward: see `Critic.trainable_forward`); the
    frozen reference and reward model stay plain full copies on this process's device. Sets `critic.wrapped`;
    returns the policy module the update calls and the optimizer. One process: both as they are."""
    if group.world == 1:
        return policy, optimizer
    for model in frozen:
        if model is not None:
            model.to(group.device)
    net = critic.trainable_forward()
    if net is None:
        return group.prepare(policy, optimizer)
    policy, critic.wrapped, optimizer = group.prepare(policy, net, optimizer)
    return policy, optimizer


def backward_share(group: ProcessGroup, loss: Tensor) -> None:
    """Backward of this process's share of a global mean: times W, since DDP averages gradients over W."""
    if group.world == 1:
        loss.backward()
    else:
        group.backward(loss * group.world)


def summed(group: ProcessGroup, loss: float, stats: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Sums over processes of a minibatch's loss and statistics (each process holds its share of them)."""
    if group.world == 1:
        return loss, stats
    keys = sorted(stats)
    sums = group.sum([loss] + [stats[k] for k in keys])
    return sums[0], dict(zip(keys, sums[1:]))
