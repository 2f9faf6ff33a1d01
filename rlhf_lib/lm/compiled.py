"""A compiled decode step on a static KV cache (`ppo.rollout_engine: compiled`): the technique of gpt-fast, through
transformers' `StaticCache` and `torch.compile` (inductor on a CPU; CUDA graphs on a GPU, mode "reduce-overhead").

Every decode step has the same shapes, input ids (B, 1), the mask (B, W + R) with 0 after the newest token, position
ids (B, 1) and the cache position (1,), so one compiled graph serves every step of every call with the same batch
size and cache length. Prompt widths are rounded up to a multiple of `bucket` (more left padding; the prompt's
tokens keep their positions), so a run compiles a handful of shapes. The weights are read by the graph as inputs:
an optimizer step that updates them in place needs no recompile. The prompt itself (prefill) runs eagerly.

Per graph: a `StaticCache` of the batch size and length, zeroed at the start of each call. At most `COMPILED_GRAPHS` are
kept (the latest used; a whole batch and the last, partial one): an older graph and its cache are dropped, and its
shape compiles again if it comes back. Each graph's recompiles count against its own limit (`isolate_recompiles`), so
many shapes in one process never silently fall back to eager. The first step of a graph compiles it: those seconds
are `compile_seconds`, apart from the generation's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from rlhf_lib.config.ppo import COMPILED_GRAPHS, COMPILED_PROMPT_BUCKET
from rlhf_lib.lm.scoring import cache_kwarg, keep_last

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class CompiledDecoder:
    """A `generation.Decoder` whose step is compiled per (model, batch size, cache length, device); kept across calls
    (a PPO run holds one), so each shape compiles once."""

    def __init__(self, bucket: int = COMPILED_PROMPT_BUCKET):
        if bucket < 1:
            raise ValueError(f"bucket must be >= 1, got {bucket}")
        self.bucket = bucket
        self.graphs: dict[tuple, dict[str, Any]] = {}
        self.compile_seconds = 0.0  # the first step of each shape: tracing and code generation
        self.compiles = 0
        self._current: dict[str, Any] | None = None

    def prompt_width(self, p: int) -> int:
        return -(-p // self.bucket) * self.bucket

    def _graph(self, policy: PreTrainedModel, batch: int, capacity: int, device: torch.device) -> dict[str, Any]:
        key = (id(policy), batch, capacity, str(device), torch.is_autocast_enabled(device.type))
        graph = self.graphs.pop(key, None)
        if graph is not None:
            self.graphs[key] = graph  # the most recently used last
            graph["cache"].reset()
            return graph
        while len(self.graphs) >= COMPILED_GRAPHS:  # the oldest graph and its cache go
            del self.graphs[next(iter(self.graphs))]
        try:
            from transformers.cache_utils import StaticCache

            kv = StaticCache(config=policy.config, max_cache_len=capacity)
        except (ImportError, TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"ppo.rollout_engine=compiled: {type(policy).__name__} has no static KV cache "
                             f"({type(e).__name__}: {e}); use rollout_engine 'hf'") from None
        kw = cache_kwarg(type(policy))

        def step(ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache_position: torch.Tensor):
            out = policy(input_ids=ids, attention_mask=attn, position_ids=pos, cache_position=cache_position,
                         use_cache=True, **{kw: kv})
            return out.logits[:, -1]

        mode = "reduce-overhead" if device.type == "cuda" else None  # CUDA graphs on a GPU
        graph = {"cache": kv, "kw": kw, "fn": torch.compile(step, dynamic=False, mode=mode, isolate_recompiles=True),
                 "compiled": False}
        self.graphs[key] = graph
        return graph

    def prefill(self, policy, query, attn, pos, capacity):
        device = query.device
        graph = self._current = self._graph(policy, query.shape[0], capacity, device)
        width = query.shape[1]
        out = policy(input_ids=query, attention_mask=attn, position_ids=pos,
                     cache_position=torch.arange(width, device=device), use_cache=True,
                     **{graph["kw"]: graph["cache"]}, **keep_last(policy, 1))
        return out.logits[:, -1]

    def step(self, token, attn, pos, n):
        graph = self._current
        args = (token.clone(), attn, pos, torch.tensor([n], device=token.device))
        if graph["compiled"]:
            return graph["fn"](*args)
        t0 = time.perf_counter()
        logits = graph["fn"](*args)
        self.compile_seconds += time.perf_counter() - t0
        self.compiles += 1
        graph["compiled"] = True
        return logits
