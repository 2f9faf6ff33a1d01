"""LoRA adapters (peft) on a transformers model, injected in place: the supervised stages (`sft.lora`,
`reward.lora`) and PPO (`ppo.lora`, rlhf_lib/ppo/lora.py) train them instead of every weight.

`get_peft_model` injects the adapter layers into the model in place and freezes every base weight; the training
loops keep calling the transformers model itself (its forward signature, KV cache and prompt sharing intact). The
supervised stages merge the adapters back (`merge_in_place`) before they save: the registered model is a plain
transformers model, loadable without peft.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model classes are slow to import
    from peft import PeftModel
    from transformers import PreTrainedModel


def add_lora(model: PreTrainedModel, r: int, alpha: float, target_modules: list[str] | None, seed: int = 0,
             task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None) -> PeftModel:
    """Inject LoRA adapters into `model` in place (dropout 0: dropout stays off in RLHF); return the peft wrapper.
    The adapters start as a no-op (B = 0). peft draws A's initial values from torch's global RNG; they are drawn
    from `seed` here (the global state is left as it was), so they do not depend on what the process did before.
    `modules_to_save` are trained whole (a reward model's scalar head)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - peft is a pinned dependency
        raise ImportError("LoRA needs peft: pip install peft") from e
    # GPT-2 stores its projections as Conv1D (weight transposed): peft must be told, or it warns and guesses.
    fan_in_fan_out = getattr(model.config, "model_type", "") == "gpt2"
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules, bias="none",
                        task_type=task_type, fan_in_fan_out=fan_in_fan_out, modules_to_save=modules_to_save)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def merge_in_place(peft_model: PeftModel) -> PreTrainedModel:
    """Merge the adapters into the base weights and remove them: the transformers model that `add_lora` was given
    is a plain model again (with the trained weights), and is returned."""
    return peft_model.merge_and_unload()


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters that train: all of them, or with adapters only the adapters (and modules_to_save)."""
    return [p for p in model.parameters() if p.requires_grad]
