"""Direct preference optimisation: the SFT model trained on preference pairs directly, with no reward model and no
sampling (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a Reward Model"),
and its IPO variant (Azar et al. 2023).

A pair (prompt x, chosen y_c, rejected y_r) is scored by the log-ratio difference

    h = (log π(y_c|x) − log π_ref(y_c|x)) − (log π(y_r|x) − log π_ref(y_r|x)),

each log-prob summed over the response's tokens (its EOS included; prompt and padding never count). The losses are
TRL 1.12's (`DPOTrainer._compute_loss`, checked against it on one batch by `benchmarks/dpo_vs_trl.py`): sigmoid
−log σ(β·h); ipo (h̄ − 1/(2β))², where h̄ is h with each reply's log-ratio divided by its response tokens (EOS
included), the mean per token rather than the sum. With label smoothing ε the sigmoid loss is cDPO's
−(1 − ε) log σ(β·h) − ε log σ(−β·h), as TRL's sigmoid computed it up to 0.28; TRL ≥ 0.29 ignores `label_smoothing`
for sigmoid (it reads it for its robust, exo_pair and aot losses only). β·(log π − log π_ref), summed over the tokens
for either loss, is the implicit reward of a reply, whose share of held-out pairs in the right order (a tie is
wrong) is the figure that sits beside the reward model's accuracy. The metrics carry TRL's names (`rewards/chosen`,
`rewards/rejected`, `rewards/margins`, `rewards/accuracies`, `logps/chosen`, `logps/rejected`, `loss`) and TRL's
definitions.

The reference is the SFT model the policy starts from: its log-probs of every pair are computed once, in one pass
before the first step (with LoRA, the same model with its adapters disabled), and kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rlhf_lib.config import DPOConfig
from rlhf_lib.data.collate import encode_prompt_response, sft_rows, token_budget_split
from rlhf_lib.data.records import PairExample, RankedExample
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.events import Sink
from rlhf_lib.intervals import proportion_interval
from rlhf_lib.lm.scoring import gather_logprobs, no_cache
from rlhf_lib.lora import add_lora, merge_in_place, trainable
from rlhf_lib.training import (
    SupervisedRun,
    adamw_with_linear_schedule,
    global_share,
    n_batches,
    run_launched,
    seed_everything,
    shard,
    shuffled_batches,
    weighted_mean,
)

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LogFn = Callable[[int, dict[str, float]], None]
Row = tuple[list[int], int]  # token ids of prompt + response + EOS, and how many of them are the prompt's


def preference_pairs(examples: Sequence[RankedExample]) -> list[PairExample]:
    """Every pair (better, worse) of every ranked list, responses stored best first, as the reward model takes them
    (`rlhf_lib.reward.ranked_pairs`); pairwise data is a list of two, hence one pair.

    Example: a list [a, b, c] -> pairs (a, b), (a, c), (b, c).
    """
    return [PairExample(e.prompt, e.responses[i], e.responses[j], e.category)
            for e in examples for i, j in combinations(range(len(e.responses)), 2)]


def encode_pairs(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PairExample], max_length: int
                 ) -> list[tuple[Row, Row]]:
    """(chosen row, rejected row) of each pair, cut as SFT cuts them (`encode_prompt_response`, EOS appended)."""
    return [(encode_prompt_response(tokenizer, p.prompt, p.chosen, max_length),
             encode_prompt_response(tokenizer, p.prompt, p.rejected, max_length)) for p in pairs]


def response_tokens(encoded: Sequence[tuple[Row, Row]]) -> tuple[torch.Tensor, torch.Tensor]:
    """How many response tokens (EOS included) each pair's chosen and rejected rows hold, at least 1: IPO's divisors,
    TRL's `completion_mask.sum(dim=1).clamp(min=1.0)`. Shapes: N pairs -> (N,), (N,) float32."""
    n = torch.tensor([[len(c[0]) - c[1], len(r[0]) - r[1]] for c, r in encoded], dtype=torch.float32).reshape(-1, 2)
    n = n.clamp(min=1.0)
    return n[:, 0], n[:, 1]


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log π(response | prompt): the log-probs of the label tokens summed over each row, in float32.

    Shapes: logits (B, T, V), labels (B, T) -> (B,). Labels are -100 on prompt and padding tokens, which do not count;
    position t predicts token t+1, hence the shift.
    """
    targets = labels[:, 1:]
    mask = targets != -100
    logps = gather_logprobs(logits[:, :-1].float(), targets.clamp(min=0))  # (B, T-1); -100 gathers token 0, masked
    return (logps * mask).sum(-1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
             chosen_tokens: torch.Tensor | None = None, rejected_tokens: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair loss and the implicit rewards of chosen and rejected, as TRL 1.12's `DPOTrainer` computes them.

    h = (policy_chosen − ref_chosen) − (policy_rejected − ref_rejected);
    sigmoid: −(1 − ε) log σ(β·h) − ε log σ(−β·h) (ε = 0 in TRL ≥ 0.29, which ignores label smoothing here);
    ipo: (h̄ − 1/(2β))², h̄ = (policy_chosen − ref_chosen)/chosen_tokens − (policy_rejected − ref_rejected)/
    rejected_tokens: the log-ratios per response token (`response_tokens`), which ipo requires.
    Rewards: β·(policy − ref), summed over the tokens whatever the loss, without gradient.

    Shapes: each log-prob (N,) (summed over a response's tokens), token counts (N,) -> losses (N,), chosen rewards
    (N,), rejected rewards (N,).
    """
    chosen_ratio, rejected_ratio = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    if loss_type == "sigmoid":
        h = chosen_ratio - rejected_ratio
        losses = -F.logsigmoid(beta * h) * (1 - label_smoothing) - F.logsigmoid(-beta * h) * label_smoothing
    elif loss_type == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("dpo_loss: loss_type ipo needs each reply's response tokens (chosen_tokens, "
                             "rejected_tokens)")
        h_mean = chosen_ratio / chosen_tokens - rejected_ratio / rejected_tokens
        losses = (h_mean - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"dpo.loss_type: unknown {loss_type!r}; expected sigmoid or ipo")
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def step_stats(losses: torch.Tensor, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
               policy_chosen: torch.Tensor, policy_rejected: torch.Tensor) -> dict[str, float]:
    """The means over a batch's pairs under TRL's names. A tie of the rewards is not an accuracy.
    Shapes: each (N,)."""
    return {"loss": float(losses.detach().mean()), "rewards/chosen": float(chosen_rewards.mean()),
            "rewards/rejected": float(rejected_rewards.mean()),
            "rewards/margins": float((chosen_rewards - rejected_rewards).mean()),
            "rewards/accuracies": float((chosen_rewards > rejected_rewards).float().mean()),
            "logps/chosen": float(policy_chosen.detach().mean()),
            "logps/rejected": float(policy_rejected.detach().mean())}


def rows_logps(model: PreTrainedModel, rows: Sequence[Row], pad_id: int, device: torch.device) -> torch.Tensor:
    """`sequence_logps` of encoded rows, right-padded into one forward through the model's own call (a DDP wrapper
    syncs only what goes through it). Shape: N rows -> (N,)."""
    b = {k: v.to(device) for k, v in sft_rows(rows, pad_id).items()}
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **no_cache(model)).logits
    return sequence_logps(logits, b["labels"])


def budget_logps(model: PreTrainedModel, rows: Sequence[Row], pad_id: int, budget: int | None,
                 device: torch.device) -> torch.Tensor:
    """`rows_logps` in the rows' order. With a token `budget` (`dpo.micro_batch_tokens`) the rows are sorted by length
    and cut into forwards of at most `budget` padded tokens (`token_budget_split`), so a short row does not pay for a
    long row's padding; every forward stays in the graph for the one backward of the step (a pair's chosen and
    rejected rows may land in different forwards). Padding is on the right and never attended to, so the values are
    those of one forward up to float rounding.

    Example: rows of 9, 2 and 8 tokens with budget 16 -> forwards [2, 8] and [9]: 25 padded tokens, not 27.
    Shape: N rows -> (N,)."""
    if budget is None:
        return rows_logps(model, rows, pad_id, device)
    lengths = [len(ids) for ids, _ in rows]
    parts = token_budget_split(lengths, lengths, budget)
    out = torch.cat([rows_logps(model, [rows[i] for i in part], pad_id, device) for part in parts])
    order = torch.tensor([i for part in parts for i in part], device=out.device)
    return out[torch.argsort(order)]


@torch.no_grad()
def pair_logps(model: PreTrainedModel, encoded: Sequence[tuple[Row, Row]], pad_id: int, batch_size: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) sequence log-probs of encoded pairs, `batch_size` pairs per forward, in eval mode (the
    mode is restored). Shapes: N pairs -> (N,), (N,) float32 on the CPU."""
    was_training = model.training
    model.eval()
    chosen, rejected = torch.zeros(len(encoded)), torch.zeros(len(encoded))
    for i in range(0, len(encoded), batch_size):
        part = encoded[i : i + batch_size]
        lp = rows_logps(model, [c for c, _ in part] + [r for _, r in part], pad_id, device).float().cpu()
        chosen[i : i + len(part)], rejected[i : i + len(part)] = lp[: len(part)], lp[len(part) :]
    model.train(was_training)
    return chosen, rejected


def reference_logps(model: PreTrainedModel, encoded: Sequence[tuple[Row, Row]], pad_id: int, batch_size: int,
                    device: torch.device, adapters=None) -> tuple[torch.Tensor, torch.Tensor]:
    """`pair_logps` of the reference: the model before its first step, or with LoRA (`adapters`, the peft wrapper
    `add_lora` returned) the same model with its adapters disabled, so no copy of the weights is kept.
    Shapes: N pairs -> (N,), (N,) float32 on the CPU."""
    off = adapters.disable_adapter() if adapters is not None else contextlib.nullcontext()
    with off:
        return pair_logps(model, encoded, pad_id, batch_size, device)


def train_dpo(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[RankedExample],
    cfg: DPOConfig,
    log: LogFn | None = None,
    group: ProcessGroup | None = None,
    gradient_checkpointing: bool = False,
) -> tuple[dict[str, float], torch.nn.Module]:
    """Train the causal LM `model` in place with DPO (or IPO) on every pair of the ranked lists `examples`; returns
    the final metrics and the model as prepared for the process group. The reference log-probs of every pair are
    computed once before the first step. Calls `log(step, metrics)` every step on the main process. Under
    `accelerate launch` each process takes its slice of every global batch of `cfg.batch_size` pairs and the loss
    is the mean over the batch's pairs, as with one process (`rlhf_lib.training`)."""
    seed_everything(cfg.seed)
    group = group or ProcessGroup()
    pairs = preference_pairs(examples)
    if not pairs:
        raise ValueError("dpo: the preference data holds no pair (every ranked list has one response)")
    encoded = encode_pairs(tokenizer, pairs, cfg.max_length)
    chosen_tokens, rejected_tokens = response_tokens(encoded)
    total = n_batches(len(pairs), cfg.batch_size, cfg.epochs, cfg.max_steps)  # the schedule ends at max_steps
    adapted = add_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules, cfg.seed) if cfg.lora else None
    opt, sched = adamw_with_linear_schedule(trainable(model), cfg.lr, cfg.weight_decay, total)
    run = SupervisedRun(group, model, opt, gradient_checkpointing)
    model = run.model
    pad = tokenizer.pad_token_id
    ref_chosen, ref_rejected = reference_logps(model, encoded, pad, cfg.eval_batch_size, group.device, adapted)
    model.train()
    ema = None
    for step, (epoch, batch) in enumerate(shuffled_batches(range(len(pairs)), cfg.batch_size, cfg.epochs, cfg.seed)):
        if step >= total:
            break
        mb, real = shard(batch, group.rank, group.world)
        lp = budget_logps(model, [encoded[i][0] for i in mb] + [encoded[i][1] for i in mb], pad,
                          cfg.micro_batch_tokens, group.device)
        idx = torch.tensor(mb)
        policy_chosen, policy_rejected = lp[: len(mb)], lp[len(mb) :]
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            policy_chosen, policy_rejected, ref_chosen[idx].to(lp.device), ref_rejected[idx].to(lp.device), cfg.beta,
            cfg.loss_type, cfg.label_smoothing, chosen_tokens[idx].to(lp.device), rejected_tokens[idx].to(lp.device))
        loss, _ = global_share(group, losses.mean(), float(len(mb)) if real else 0.0, lp)
        loss_value, grad_norm = run.step(loss, sched, cfg.max_grad_norm, "DPO", step)
        stats = step_stats(losses, chosen_rewards, rejected_rewards, policy_chosen, policy_rejected)
        stats = weighted_mean(group, {k: v for k, v in stats.items() if k != "loss"}, float(len(mb)) if real else 0.0)
        ema = loss_value if ema is None else 0.9 * ema + 0.1 * loss_value
        if log and group.is_main:
            log(step, {"loss": loss_value, **stats, "dpo/loss_ema": ema, "dpo/grad_norm": grad_norm,
                       "dpo/lr": sched.get_last_lr()[0], "dpo/epoch": float(epoch)})
    run.finish()
    if adapted is not None:
        merge_in_place(adapted)  # `model` is a plain transformers model again, with the trained weights
    final = {"dpo/final_loss_ema": float(ema or 0.0), "dpo/steps": float(total), "dpo/pairs": float(len(pairs))}
    return final, run.model


def heldout_metrics(policy: tuple[torch.Tensor, torch.Tensor], reference: tuple[torch.Tensor, torch.Tensor],
                    beta: float) -> dict[str, float]:
    """The implicit reward β·(log π − log π_ref) on held-out pairs: the share of pairs it orders right (a tie is
    wrong, as in the reward model's report) with its Wilson 95 % interval, and its mean margin.
    Shapes: each of the (chosen, rejected) tensors (N,)."""
    chosen = beta * (policy[0] - reference[0])
    rejected = beta * (policy[1] - reference[1])
    right = chosen > rejected
    n, k = int(right.numel()), int(right.sum())
    low, high = proportion_interval(k, n)
    return {"dpo/heldout_accuracy": k / n if n else float("nan"), "dpo/heldout_accuracy_ci95_low": low,
            "dpo/heldout_accuracy_ci95_high": high, "dpo/heldout_margin": float((chosen - rejected).mean()) if n
            else float("nan")}


def launched(job: dict, workdir: Path, sink: Sink) -> None:
    """One process of DPO under `accelerate launch` (the launcher's entry point; see `training.run_launched`)."""
    from rlhf_lib.models import build_policy

    examples = [RankedExample(e["prompt"], tuple(e["responses"]), e.get("category")) for e in job["examples"]]
    job = {**job, "examples": examples, "config": DPOConfig(**job["config"])}
    run_launched(train_dpo, lambda path, tokenizer: build_policy(tokenizer, str(path)), job, workdir, sink)
