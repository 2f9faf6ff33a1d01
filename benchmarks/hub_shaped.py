#!/usr/bin/env python3
"""A hub-shaped model without the hub: a small Qwen2 (or Llama, GPT-NeoX) causal LM saved with `save_pretrained`,
with a byte-level BPE tokenizer trained on the demo task, so that `model.name_or_path=DIR` takes the same
`from_pretrained` path a hub model takes (its own architecture, RoPE, grouped-query attention, tied embeddings,
a checkpoint saved in bfloat16), on CPU in minutes.

    python -m benchmarks.hub_shaped /tmp/qwen2-tiny
    rlhf run full --preset qwen-0.5b --set model.name_or_path=/tmp/qwen2-tiny --set data.preferences=null ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

ARCHS = ("qwen2", "llama", "gpt_neox")


def build(out: Path, arch: str = "qwen2", hidden: int = 64, layers: int = 2, dtype: str = "bfloat16",
          vocab_size: int = 512, seed: int = 0) -> Path:
    """Save a randomly initialised `arch` model and a tokenizer trained on the demo task's texts to `out`."""
    import tempfile

    import transformers

    from rlhf_lib.config import DataConfig
    from rlhf_lib.demo_task.builder import build_demo_task
    from rlhf_lib.models import train_tokenizer
    from stages.sft import tokenizer_corpus

    with tempfile.TemporaryDirectory() as tmp:
        build_demo_task(DataConfig(), tmp)
        tokenizer = train_tokenizer(list(tokenizer_corpus(Path(tmp))), vocab_size)
    common = {"vocab_size": len(tokenizer), "hidden_size": hidden, "intermediate_size": 4 * hidden,
              "num_hidden_layers": layers, "num_attention_heads": 4, "max_position_embeddings": 256,
              "bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": arch != "gpt_neox"}
    config = {"qwen2": lambda: transformers.Qwen2Config(num_key_value_heads=2, **common),
              "llama": lambda: transformers.LlamaConfig(num_key_value_heads=2, **common),
              "gpt_neox": lambda: transformers.GPTNeoXConfig(rotary_pct=0.25, **common)}[arch]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--arch", choices=ARCHS, default="qwen2")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    a = p.parse_args(argv)
    print(build(a.out, a.arch, a.hidden, a.layers, a.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
