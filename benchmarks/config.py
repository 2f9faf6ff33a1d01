"""The benchmarks' config: the pipeline's own (`PipelineConfig`: model sizes, `ppo.*`, `torch_threads`), read with
the same presets, files and `--set` as `rlhf run`, plus a `bench` section of what only a benchmark needs."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from flows.settings import PRESETS
from rlhf_lib.config import PipelineConfig, Section

BENCH_PRESETS = Path(__file__).resolve().parent / "presets"
PRESET_DIRS = (BENCH_PRESETS, PRESETS)


class BenchConfig(Section):
    """Keys of `rlhf bench` besides the pipeline's: how long to measure, the synthetic prompts, the device."""

    iterations: int = Field(30, ge=1, description="PPO iterations measured, warm-up included.")
    warmup_iterations: int = Field(1, ge=0, description="Leading iterations left out of the statistics.")
    num_prompts: int = Field(512, ge=1, description="Synthetic prompts the sampler cycles through.")
    prompt_length: int = Field(16, ge=1, description="Every prompt is exactly this many tokens (no padding).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights and activations.")
    device: str = Field("cpu", description="torch device of the four models, e.g. cpu or cuda.")
    attn_implementation: str = Field("sdpa", description="transformers attention backend.")
    activation_function: str = Field("gelu_pytorch_tanh", description="GPT-2 MLP activation: gelu_pytorch_tanh "
                                     "(the project's models: tanh GELU in one fused kernel) or gelu_new (TRL's GPT-2 "
                                     "default: the same function in 7 elementwise ops).")
    peak_tflops: float | None = Field(None, gt=0, description="Datasheet peak of the device for MFU (e.g. 989 for "
                                      "an H100/H200 in dense bf16); null: MFU against the measured matmul roofline.")


class BenchPipelineConfig(PipelineConfig):
    bench: BenchConfig = Field(default_factory=BenchConfig)
