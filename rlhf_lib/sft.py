"""Supervised fine-tuning on demonstrations: causal-LM loss on response tokens only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rlhf_lib.config import SFTConfig
from rlhf_lib.data.collate import encode_prompt_response, sft_rows, token_budget_split
from rlhf_lib.data.records import SFTExample
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.events import Sink
from rlhf_lib.lm.scoring import no_cache
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
)

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LogFn = Callable[[int, dict[str, float]], None]


def response_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Next-token cross-entropy averaged over response tokens (labels != -100).

    Shapes: logits (B, T, V), labels (B, T). Position t predicts token t+1, hence the shift.
    """
    targets = labels[:, 1:]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=-100)
    n_tokens = int((targets != -100).sum())
    return loss, {"loss": float(loss.detach()), "tokens": float(n_tokens)}


def batch_loss(model: PreTrainedModel, encoded: Sequence[tuple[Sequence[int], int]], pad_id: int, budget: int | None,
               device: torch.device) -> tuple[torch.Tensor, float, torch.Tensor]:
    """`response_lm_loss` of a batch of encoded rows (ids, prompt tokens), the mean over all its response tokens.
    With a token `budget` the rows are sorted by length and cut into forwards of at most `budget` padded tokens
    (`token_budget_split`), each forward's summed loss divided by the batch's token count, so short rows do not pay
    for a long row's padding and the loss is the one-forward loss. Returns (loss, response tokens, the last forward's
    logits: an anchor for `global_share`)."""
    lengths = [len(ids) for ids, _ in encoded]
    parts = [list(range(len(encoded)))] if budget is None else token_budget_split(lengths, lengths, budget)
    losses, counts = [], []
    for part in parts:
        b = {k: v.to(device) for k, v in sft_rows([encoded[i] for i in part], pad_id).items()}
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **no_cache(model)).logits
        loss, stats = response_lm_loss(logits, b["labels"])  # (b, T, V) logits
        losses.append(loss)
        counts.append(stats["tokens"])
    n = sum(counts)
    if len(parts) == 1 or n == 0:
        return losses[0], n, logits
    return sum(l * (c / n) for l, c in zip(losses, counts) if c), n, logits


def train_sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[SFTExample],
    cfg: SFTConfig,
    log: LogFn | None = None,
    group: ProcessGroup | None = None,
    gradient_checkpointing: bool = False,
) -> tuple[dict[str, float], torch.nn.Module]:
    """Fine-tune `model` in place. Calls `log(step, metrics)` every step (on the main process); returns the final
    metrics and the model as prepared for the process group (what gathering its weights from every process needs).
    Under `accelerate launch` each process trains on its slice of every global batch of `cfg.batch_size`
    demonstrations, and the loss is the mean over all the batch's response tokens, as with one process (see
    `rlhf_lib.training`)."""
    seed_everything(cfg.seed)
    group = group or ProcessGroup()
    total = n_batches(len(examples), cfg.batch_size, cfg.epochs, cfg.max_steps)  # the schedule ends at max_steps
    adapted = add_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules, cfg.seed) if cfg.lora else None
    opt, sched = adamw_with_linear_schedule(trainable(model), cfg.lr, cfg.weight_decay, total)
    run = SupervisedRun(group, model, opt, gradient_checkpointing)
    model = run.model
    model.train()
    ema = None
    for step, (epoch, batch) in enumerate(shuffled_batches(examples, cfg.batch_size, cfg.epochs, cfg.seed)):
        if step >= total:
            break
        mb, real = shard(batch, group.rank, group.world)
        encoded = [encode_prompt_response(tokenizer, e.prompt, e.response, cfg.max_length) for e in mb]
        loss, n_tokens, logits = batch_loss(model, encoded, tokenizer.pad_token_id, cfg.micro_batch_tokens,
                                            group.device)
        loss, _ = global_share(group, loss, n_tokens if real else 0.0, logits)
        loss_value, grad_norm = run.step(loss, sched, 1.0, "SFT", step)
        ema = loss_value if ema is None else 0.9 * ema + 0.1 * loss_value
        metrics = {"sft/loss": loss_value, "sft/loss_ema": ema, "sft/grad_norm": grad_norm,
                   "sft/lr": sched.get_last_lr()[0], "sft/epoch": float(epoch)}
        if log and group.is_main:
            log(step, metrics)
    run.finish()
    if adapted is not None:
        merge_in_place(adapted)  # `model` is a plain transformers model again, with the trained weights
    return {"sft/final_loss_ema": float(ema or 0.0), "sft/steps": float(total)}, run.model


def launched(job: dict, workdir: Path, sink: Sink) -> None:
    """One process of SFT under `accelerate launch` (the launcher's entry point; see `training.run_launched`)."""
    from rlhf_lib.models import build_policy

    job = {**job, "examples": [SFTExample(**e) for e in job["examples"]], "config": SFTConfig(**job["config"])}
    run_launched(train_sft, lambda path, tokenizer: build_policy(tokenizer, str(path)), job, workdir, sink)
