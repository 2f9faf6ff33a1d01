"""Evaluation during PPO (`ppo.eval_every`) and the choice of the policy that is kept (`ppo.keep`).

Every N iterations the policy answers a fixed subset of the held-out prompts, with the same seeded draws each time,
and is scored by the reward model, the gold judge where the task has one, its KL to the reference and its length
(the `heldout/*` metrics). With `ppo.keep: best` the policy of the iteration with the best held-out figure (gold where
there is a judge, else RM reward) is the one saved and registered. Choosing on held-out prompts makes that figure an
optimistic estimate for those prompts: the eval stage's report says which iteration was kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from rlhf_lib.lm.generation import decode_responses, encode_prompts, sample
from rlhf_lib.lm.kl import kl_per_token
from rlhf_lib.lm.masked import masked_sum
from rlhf_lib.lm.scoring import response_logprobs
from rlhf_lib.ppo.lora import adapters_off
from rlhf_lib.ppo.types import BestPolicy

if TYPE_CHECKING:
    from rlhf_lib.ppo.trainer import PPOTrainer

Judge = Callable[[str, str], float]
SEED_OFFSET = 7919  # the held-out draws' own stream, apart from the training one


def selection_metric(judged: bool) -> str:
    """What `ppo.keep: best` maximises: the gold judge's score where there is one, else the RM's."""
    return "heldout/gold" if judged else "heldout/reward"


@torch.inference_mode()
def heldout_stats(trainer: PPOTrainer, prompts: Sequence[str], judge: Judge | None) -> dict[str, float]:
    """The policy on `prompts`: mean summed score of the reward sources (`heldout/reward`), gold score (`heldout/gold`, with a judge), KL to the
    reference per response (k1, nats) and length in tokens. `ppo.score_batch_size` prompts at a time, under the
    trainer's autocast; the same draws at every call (its own generator), so the curve moves only with the policy."""
    c, tok = trainer.cfg, trainer.models.tokenizer
    gen = torch.Generator().manual_seed(c.seed + SEED_OFFSET)
    rewards, kls, lengths, texts = [], [], [], []
    n = c.score_batch_size
    with trainer.precision():
        for i in range(0, len(prompts), n):
            q, qm = (t.to(trainer.device) for t in encode_prompts(tok, prompts[i : i + n], trainer.max_prompt_tokens))
            chunk, extra = prompts[i : i + n], {}
            if trainer.env is not None:  # multi-turn: the policy's own tokens are `act`, its last turn the text
                ep = trainer.episodes(trainer.models.policy, chunk, q, qm, gen)
                r, rm, act = ep.response, ep.response_mask, ep.action_mask
                logp = trainer._policy_logprobs(q, qm, r, rm)
                extra = {"env_returns": ep.returns, "completions": [t[-1].text for t in ep.turns]}
            else:
                r, rm, logp = sample(trainer.models.policy, q, qm, max_new_tokens=c.max_new_tokens,
                                     temperature=c.temperature, eos_token_id=tok.eos_token_id,
                                     pad_token_id=tok.pad_token_id, generator=gen)
                act = rm
            with adapters_off(trainer.peft):
                ref, _ = response_logprobs(trainer.reference, q, qm, r, rm, c.temperature, chunk=c.logprob_chunk)
            kls.append(masked_sum(kl_per_token(logp, ref, "k1"), act, dim=1).float().cpu())
            rewards.append(trainer.rewards(chunk, q, qm, r, rm, **extra).total.float().cpu())
            lengths.append(act.sum(1).float().cpu())
            texts += extra.get("completions") or decode_responses(tok, r, rm)
    stats = {"heldout/reward": float(torch.cat(rewards).mean()), "heldout/kl": float(torch.cat(kls).mean()),
             "heldout/length": float(torch.cat(lengths).mean())}
    if judge is not None:
        stats["heldout/gold"] = sum(judge(p, t) for p, t in zip(prompts, texts)) / len(texts)
    return stats


def consider(best: BestPolicy | None, trainer: PPOTrainer, stats: dict[str, float], iteration: int,
             judged: bool) -> BestPolicy | None:
    """The new best when this iteration's held-out figure beats `best` (or there is none), with a copy of the
    policy's weights; else `best` unchanged."""
    metric = selection_metric(judged)
    value = stats[metric]
    if best is not None and value <= best.value:
        return best
    state = {k: v.detach().to("cpu", copy=True) for k, v in trainer.export_policy().state_dict().items()}
    return BestPolicy(iteration, metric, value, state)
