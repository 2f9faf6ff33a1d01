"""Reward model: a scalar head read at the last real token, trained with Bradley-Terry over every pair of a
ranked list (InstructGPT section 3.5: all K(K-1)/2 comparisons of a prompt in one batch, which avoids the
overfitting of treating each pair as its own example)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rlhf_lib.config import RewardConfig
from rlhf_lib.data.collate import encode_prompt_response, pad_right, token_budget_split
from rlhf_lib.data.records import PairExample, RankedExample
from rlhf_lib.devices import module_device
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.events import Sink
from rlhf_lib.lm.scoring import no_cache, sequence_scores
from rlhf_lib.lora import add_lora, merge_in_place, trainable
from rlhf_lib.prompt_sharing import prompt_groups, shared_prompt_scores, supports_prompt_sharing
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


def ranked_pairs(list_sizes: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices (better, worse) of every pair of every list, for responses stored best first, list after list.

    Example: sizes [3] -> better [0, 0, 1], worse [1, 2, 2]. Shapes: (N_pairs,), (N_pairs,).
    """
    better, worse, offset = [], [], 0
    for k in list_sizes:
        for i in range(k):
            for j in range(i + 1, k):
                better.append(offset + i)
                worse.append(offset + j)
        offset += k
    return torch.tensor(better, dtype=torch.long), torch.tensor(worse, dtype=torch.long)


def bradley_terry_loss(
    scores: torch.Tensor, better: torch.Tensor, worse: torch.Tensor, list_of_pair: torch.Tensor,
    weights: torch.Tensor | None = None, label_smoothing: float = 0.0, center_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-log sigmoid(r_better - r_worse), averaged within each list and then over lists (each prompt weighs the
    same whatever its K, as in InstructGPT's 1/C(K,2) normalisation). With `weights`, the mean within a list is
    weighted: sum_p w_p l_p / sum_p w_p.

    `label_smoothing` eps trusts each label with probability 1 - eps (a noisy labeller):
    -(1 - eps) log sigmoid(m) - eps log sigmoid(-m), whose minimum sits at the finite margin log((1 - eps) / eps)
    instead of at infinity. `center_coef` c adds c * (r_better + r_worse)^2 per pair (TRL's
    center_rewards_coefficient, Eisenstein et al. 2023): scores stay centred at 0 without changing which reply wins.

    Shapes: scores (N,), better/worse/list_of_pair/weights (N_pairs,).
    """
    margin = scores[better] - scores[worse]
    per_pair = -F.logsigmoid(margin)
    if label_smoothing:
        per_pair = (1 - label_smoothing) * per_pair - label_smoothing * F.logsigmoid(-margin)
    if center_coef:
        per_pair = per_pair + center_coef * (scores[better] + scores[worse]) ** 2
    w = torch.ones_like(per_pair) if weights is None else weights.to(per_pair.dtype)
    n_lists = int(list_of_pair.max()) + 1
    zeros = torch.zeros(n_lists, dtype=scores.dtype, device=scores.device)
    per_list = zeros.index_add(0, list_of_pair, w * per_pair)
    counts = zeros.index_add(0, list_of_pair, w)
    loss = (per_list / counts).mean()
    return loss, {"loss": float(loss.detach()), "accuracy": float((margin > 0).float().mean()),
                  "margin": float(margin.detach().mean())}


def pair_weights(better: torch.Tensor, worse: torch.Tensor, kind: str) -> torch.Tensor | None:
    """Per-pair loss weights: None (uniform) or the rank distance worse - better (flat indices of one list are
    its ranks): a noisy labeller swaps neighbours far more often than responses ranked far apart, so the far pairs
    are the surer labels. Shape: (N_pairs,)."""
    return (worse - better).float() if kind == "rank_distance" else None


def closest_pair_weights(lists: Sequence[Sequence[str]]) -> torch.Tensor:
    """Per-pair weights of the curriculum (`reward.curriculum_steps`): 1 for the pair of each list whose two
    responses are fewest character edits (Levenshtein) apart, the first such pair on a tie, 0 for the others; in the
    order of `ranked_pairs`. Example: ["ab", "xy", "ac"] -> pairs (0,1) (0,2) (1,2) at 2, 1, 2 edits -> [0, 1, 0].
    Shape: (N_pairs,)."""
    from rapidfuzz.distance import Levenshtein

    out: list[float] = []
    for responses in lists:
        k = len(responses)
        edits = [Levenshtein.distance(responses[i], responses[j]) for i in range(k) for j in range(i + 1, k)]
        out.extend(float(n == edits.index(min(edits))) for n in range(len(edits)))
    return torch.tensor(out)


def _rows(tokenizer, prompt_response: Sequence[tuple[str, str]], max_length: int) -> list[list[int]]:
    return [encode_prompt_response(tokenizer, p, r, max_length)[0] for p, r in prompt_response]


def _encode(tokenizer, prompt_response: Sequence[tuple[str, str]], max_length: int):
    return pad_right(_rows(tokenizer, prompt_response, max_length), tokenizer.pad_token_id)


def training_scores(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`sequence_scores` through the model's own forward, as training needs: a DDP/FSDP/DeepSpeed wrapper only
    syncs gradients of calls that go through it. Valid for right-padded rows: the `*ForSequenceClassification`
    head pools at the rightmost non-PAD token, which is the last real token since PAD never occurs in text.
    Shape: (B, T) -> (B,)."""
    return model(input_ids=input_ids, attention_mask=attention_mask, **no_cache(model)).logits.squeeze(-1)


def batch_scores(model: PreTrainedModel, rows: Sequence[Sequence[int]], pad_id: int, budget: int | None,
                 device: torch.device) -> torch.Tensor:
    """`training_scores` of token rows, in their order. With a token `budget` the rows are sorted by length and cut
    into forwards of at most `budget` padded tokens (`token_budget_split`), so short rows do not pay for a long row's
    padding; every forward stays in the graph for one backward over the whole batch, whose pairs cross the forwards.
    The scores are those of one forward: padding is on the right and a row never attends to it.

    Example: rows of 9, 2 and 8 tokens with budget 16 -> forwards [2, 8] (2 x 8 = 16 tokens) and [9] (9), against
    3 x 9 = 27 in one forward. Shape: N rows -> (N,).
    """
    lengths = [len(r) for r in rows]
    parts = [list(range(len(rows)))] if budget is None else token_budget_split(lengths, lengths, budget)
    scores = []
    for part in parts:
        ids, mask = pad_right([rows[i] for i in part], pad_id)
        scores.append(training_scores(model, ids.to(device), mask.to(device)))
    order = torch.tensor([i for part in parts for i in part], device=device)
    return torch.cat(scores)[torch.argsort(order)]


def step_scores(model: PreTrainedModel, encoded: Sequence[tuple[Sequence[int], int]], pad_id: int,
                budget: int | None, device: torch.device, share_prompts: bool) -> torch.Tensor:
    """Training scores of (ids, prompt tokens) rows in their order: each distinct prompt run once
    (`prompt_sharing.shared_prompt_scores`) when `share_prompts`, every row has a prompt and some rows share one
    (a long prompt cut to fit each response's length can make every row's prompt its own), else `batch_scores`.
    Shape: N rows -> (N,)."""
    if share_prompts:
        prompts, responses, prompt_of = prompt_groups(encoded)
        if all(prompts) and len(prompts) < len(encoded):
            return shared_prompt_scores(model, prompts, responses, prompt_of, pad_id, budget, device)
    return batch_scores(model, [ids for ids, _ in encoded], pad_id, budget, device)


def _pair_index(batch: Sequence[RankedExample], device: torch.device):
    """(better, worse, list_of_pair) of every pair of every list of `batch`, on `device`."""
    better, worse = ranked_pairs([len(e.responses) for e in batch])
    list_of_pair = torch.cat([torch.full((len(e.responses) * (len(e.responses) - 1) // 2,), i)
                              for i, e in enumerate(batch)])
    return better.to(device), worse.to(device), list_of_pair.to(device)


def train_reward_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[RankedExample],
    cfg: RewardConfig,
    log: LogFn | None = None,
    group: ProcessGroup | None = None,
    gradient_checkpointing: bool = False,
) -> tuple[dict[str, float], torch.nn.Module]:
    """Train `model` (a `*ForSequenceClassification` with one label) in place on ranked lists; returns the final
    metrics and the model as prepared for the process group. Under `accelerate launch` each process takes a slice of
    the lists of every global batch; the loss is still the mean over the batch's lists, and accuracy and margin are
    pooled over all its pairs."""
    seed_everything(cfg.seed)
    group = group or ProcessGroup()
    total = n_batches(len(examples), cfg.batch_size, cfg.epochs, cfg.max_steps)  # the schedule ends at max_steps
    adapted = (add_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules, cfg.seed, "SEQ_CLS", ["score"])
               if cfg.lora else None)
    opt, sched = adamw_with_linear_schedule(trainable(model), cfg.lr, cfg.weight_decay, total)
    run = SupervisedRun(group, model, opt, gradient_checkpointing)
    model = run.model
    model.train()
    share = (cfg.share_prompts and not gradient_checkpointing and not group.shards_parameters
             and supports_prompt_sharing(model))
    acc_ema = None
    for step, (epoch, batch) in enumerate(shuffled_batches(examples, cfg.batch_size, cfg.epochs, cfg.seed)):
        if step >= total:
            break
        mb, real = shard(batch, group.rank, group.world)
        encoded = [encode_prompt_response(tokenizer, e.prompt, r, cfg.max_length) for e in mb for r in e.responses]
        scores = step_scores(model, encoded, tokenizer.pad_token_id, cfg.micro_batch_tokens, group.device, share)
        better, worse, list_of_pair = _pair_index(mb, group.device)
        weights = (closest_pair_weights([e.responses for e in mb]).to(group.device) if step < cfg.curriculum_steps
                   else pair_weights(better, worse, cfg.pair_weight))
        loss, stats = bradley_terry_loss(scores, better, worse, list_of_pair, weights, cfg.label_smoothing,
                                         cfg.center_coef)
        loss, _ = global_share(group, loss, float(len(mb)) if real else 0.0, scores)
        loss_value, grad_norm = run.step(loss, sched, 1.0, "reward-model", step)
        n_pairs = sum(len(e.responses) * (len(e.responses) - 1) // 2 for e in mb) if real else 0
        stats = weighted_mean(group, {"accuracy": stats["accuracy"], "margin": stats["margin"]}, n_pairs)
        acc_ema = stats["accuracy"] if acc_ema is None else 0.9 * acc_ema + 0.1 * stats["accuracy"]
        if log and group.is_main:
            log(step, {"reward/loss": loss_value, "reward/train_accuracy": stats["accuracy"],
                       "reward/train_accuracy_ema": acc_ema, "reward/margin": stats["margin"],
                       "reward/grad_norm": grad_norm, "reward/lr": sched.get_last_lr()[0],
                       "reward/epoch": float(epoch)})
    run.finish()
    if adapted is not None:
        merge_in_place(adapted)  # `model` is a plain transformers model again, with the trained weights
    return {"reward/train_accuracy_ema": float(acc_ema or 0.0), "reward/steps": float(total)}, run.model


def launched(job: dict, workdir: Path, sink: Sink) -> None:
    """One process of reward-model training under `accelerate launch` (the launcher's entry point; see
    `training.run_launched`)."""
    from rlhf_lib.models import build_scalar_model

    examples = [RankedExample(e["prompt"], tuple(e["responses"])) for e in job["examples"]]
    job = {**job, "examples": examples, "config": RewardConfig(**job["config"])}
    run_launched(train_reward_model, lambda path, tokenizer: build_scalar_model(path), job, workdir, sink)


@torch.no_grad()
def score_texts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], responses: Sequence[str],
    max_length: int, batch_size: int = 64,
) -> torch.Tensor:
    """Reward-model scores of (prompt, response) texts, EOS appended as in training, `batch_size` rows per forward
    on the model's device. Rows are batched in order of length (and the scores put back in input order), so a
    short row does not pay for a long row's padding. Shape: (N,) float32, on the CPU."""
    device = module_device(model)
    rows = _rows(tokenizer, list(zip(prompts, responses)), max_length)
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))
    scores = torch.zeros(len(rows))
    for i in range(0, len(order), batch_size):
        part = order[i : i + batch_size]
        ids, mask = pad_right([rows[j] for j in part], tokenizer.pad_token_id)
        scores[part] = sequence_scores(model, ids.to(device), mask.to(device)).float().cpu()
    return scores


@torch.no_grad()
def pair_scores(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PairExample],
                max_length: int, batch_size: int = 64, share_prompts: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) reward-model scores of held-out pairs, EOS appended as in training. A pair's two rows
    run in one forward of at most `batch_size` rows, pairs in order of length, with their shared prompt run once
    (`step_scores`, where the model allows it): the scores of `score_texts`, up to float rounding, for about half
    its work on long prompts. Shapes: N pairs -> (N,), (N,) float32 on the CPU."""
    device = module_device(model)
    share = share_prompts and supports_prompt_sharing(model)
    encoded = [encode_prompt_response(tokenizer, p.prompt, r, max_length) for p in pairs
               for r in (p.chosen, p.rejected)]
    order = sorted(range(len(pairs)), key=lambda i: (max(len(encoded[2 * i][0]), len(encoded[2 * i + 1][0])), i))
    per_forward = max(1, batch_size // 2)
    scores = torch.zeros(len(encoded))
    for i in range(0, len(order), per_forward):
        rows = [r for k in order[i : i + per_forward] for r in (2 * k, 2 * k + 1)]
        scores[rows] = step_scores(model, [encoded[r] for r in rows], tokenizer.pad_token_id, None, device,
                                   share).float().cpu()
    return scores[0::2], scores[1::2]


def pairwise_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PairExample], max_length: int,
    batch_size: int = 64,
) -> float:
    """Share of pairs where the model scores `chosen` above `rejected` (`batch_size` rows per forward)."""
    prompts = [p.prompt for p in pairs]
    chosen = score_texts(model, tokenizer, prompts, [p.chosen for p in pairs], max_length, batch_size)
    rejected = score_texts(model, tokenizer, prompts, [p.rejected for p in pairs], max_length, batch_size)
    return float((chosen > rejected).float().mean())
