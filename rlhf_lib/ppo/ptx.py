"""PPO-ptx (InstructGPT, Ouyang et al. 2022, eq. 2): the SFT loss on demonstrations mixed into every update step,
and the sampler of its demonstration batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from rlhf_lib.data.collate import sft_batch
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.lm.scoring import no_cache

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel

PtxBatches = Callable[[], dict[str, torch.Tensor]]


class PtxSampler:
    """PPO-ptx demonstrations: each call draws `batch_size` (prompt, response) pairs with `generator` (the
    trainer's, so runs stay reproducible) and collates them as SFT does, cut to `max_length` tokens, on `device`."""

    def __init__(self, examples: Sequence[tuple[str, str]], tokenizer, max_length: int, batch_size: int,
                 generator: torch.Generator, device: torch.device | str = "cpu"):
        if not examples:
            raise ValueError("ppo.ptx_coef > 0 needs demonstrations (the SFT data) for the ptx loss")
        self.examples, self.tokenizer, self.max_length = list(examples), tokenizer, max_length
        self.batch_size, self.generator, self.device = batch_size, generator, torch.device(device)

    def __call__(self) -> dict[str, torch.Tensor]:
        idx = torch.randint(len(self.examples), (self.batch_size,), generator=self.generator).tolist()
        rows = [self.examples[i] for i in idx]
        batch = sft_batch(self.tokenizer, [p for p, _ in rows], [r for _, r in rows], self.max_length)
        return {k: v.to(self.device) for k, v in batch.items()}


def ptx_loss(policy: PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """PPO-ptx term (InstructGPT, Ouyang et al. 2022, eq. 2: gamma * E_pretrain[log pi]): next-token cross-entropy
    of the policy on demonstration responses. Shapes: input_ids, attention_mask, labels (N, T) -> loss ()."""
    from rlhf_lib.sft import response_lm_loss

    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits = policy(input_ids=ids, attention_mask=mask, **no_cache(policy)).logits  # (N, T, V)
    return response_lm_loss(logits.float(), batch["labels"])[0]


def ptx_share(policy: PreTrainedModel, batch: dict[str, torch.Tensor], group: ProcessGroup
               ) -> tuple[torch.Tensor, float]:
    """The ptx loss of this process's rows of the demonstration batch, and their share of its response tokens
    (the loss is a token mean): the whole batch and 1 in one process. Every row has a response token (its EOS)."""
    if group.world == 1:
        return ptx_loss(policy, batch), 1.0
    local = {k: group.local_rows(v) for k, v in batch.items()}
    return ptx_loss(policy, local), _label_tokens(local) / _label_tokens(batch)


def _label_tokens(batch: dict[str, torch.Tensor]) -> float:
    return float((batch["labels"][:, 1:] != -100).sum())
