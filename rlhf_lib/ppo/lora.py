"""LoRA on the policy (peft), with the frozen reference as the same network with its adapters switched off.

`get_peft_model` injects the adapter layers into the transformers model in place and freezes every base weight.
The loop keeps calling that transformers model itself (its forward signature, KV cache and `logits_to_keep`
intact); the peft wrapper is kept only to switch the adapters off for the reference's log-probs and to merge them
for export. Memory: no second copy of the policy for the reference, and Adam moments for the adapters only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from peft import PeftModel
    from transformers import PreTrainedModel


def add_lora(policy: PreTrainedModel, r: int, alpha: float, target_modules: list[str] | None,
             seed: int = 0) -> PeftModel:
    """`rlhf_lib.lora.add_lora` on the policy: the adapters start as a no-op (B = 0), so the adapted policy equals
    the reference at iteration 0, and every process of an `accelerate launch` group starts from the same A."""
    from rlhf_lib.lora import add_lora as inject

    return inject(policy, r, alpha, target_modules, seed)


@contextmanager
def adapters_off(peft_model: PeftModel | None) -> Iterator[None]:
    """Within the block the policy computes as its base weights: the reference model of LoRA PPO."""
    if peft_model is None:
        yield
        return
    with peft_model.disable_adapter():
        yield


def merged_copy(peft_model: PeftModel) -> PreTrainedModel:
    """A plain transformers model with the adapters merged into the weights (what gets registered): loadable
    without peft. The training model is left as it was."""
    import copy

    return copy.deepcopy(peft_model).merge_and_unload()
