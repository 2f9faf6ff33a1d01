"""vLLM as PPO's rollout generator (`ppo.rollout_engine: vllm`): GPU only, from the optional extra
`pip install 'rlhf-pipeline[vllm]'`.

vLLM holds its own copy of the policy. After each PPO update the trainer calls `sync_weights(policy)`, which loads
the new weights into that copy in place (`LLM.apply_model` -> the vLLM model's `load_weights`, which takes Hugging
Face parameter names). vLLM samples with its own kernels, usually in bf16, so its log-probs differ from the
training forward's (the known engine mismatch: Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"). The rollout's log-probs are therefore recomputed by the policy itself
(`rlhf_lib.lm.scoring.response_logprobs`), which makes the PPO ratio start at exactly 1; vLLM only chooses the
tokens. The config (`rlhf_lib.config.ppo.require_engine`) refuses the setting where vLLM is missing, before any
work.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lib.config.ppo import PPOConfig, require_engine


def rollout_engine(cfg: PPOConfig, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> VLLMRollout | None:
    """The engine `ppo.rollout_engine` asks for: a vLLM engine holding a copy of `policy`, or None for the trainer's
    own sampling loop (`hf` and `compiled`: `rlhf_lib.lm.generation.sample` through its `Decoder`)."""
    if cfg.rollout_engine != "vllm":
        return None
    return VLLMRollout(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                       seed=cfg.seed)


class VLLMRollout:
    """A vLLM engine that samples responses from the policy's current weights.

    Usage, once per PPO iteration (the HF path's `sample` returns log-probs as well; here they are recomputed):
        response, response_mask, _ = engine.generate(query, query_mask)          # (B, R) each
        logprobs, _ = response_logprobs(policy, query, query_mask, response, response_mask, temperature)
        ... score, advantages, update ...
        engine.sync_weights(policy)
    """

    def __init__(
        self,
        policy: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
    ):
        require_engine("vllm")
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("ppo.rollout_engine=vllm needs a CUDA GPU; none is visible to this process")
        # The engine core in this process: `apply_model` then reaches the model directly (no pickling of weights).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # no usage report to vLLM's servers, like Prefect's analytics
        from vllm import LLM

        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.calls = 0
        self._dir = tempfile.TemporaryDirectory(prefix="rlhf-vllm-")
        policy.save_pretrained(self._dir.name, safe_serialization=True)
        tokenizer.save_pretrained(self._dir.name)
        # generation_config="vllm": the checkpoint's generation defaults must not change our sampling parameters.
        self.llm = LLM(model=self._dir.name, tokenizer=self._dir.name, dtype=dtype, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True,
                       max_model_len=policy.config.max_position_embeddings, generation_config="vllm",
                       enable_prefix_caching=False)

    def generate(
        self, query: torch.Tensor, query_mask: torch.Tensor, with_logprobs: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Sample one response per left-padded query.

        Shapes: query, query_mask (B, P) -> response (B, R), response_mask (B, R) and, with `with_logprobs`,
        vLLM's own log-prob of each sampled token (B, R) (for measuring the engine mismatch; PPO must not use
        them). R is the longest response; after a row's EOS its tokens are PAD and its mask 0, and the EOS itself
        is a real token, as in `rlhf_lib.lm.generation.sample`.
        """
        import torch
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": q[m.bool()].tolist()} for q, m in zip(query, query_mask)]
        # One seed per request, derived from the call count: the same run samples the same tokens again.
        base = self.seed + self.calls * len(prompts)
        params = [SamplingParams(temperature=self.temperature, max_tokens=self.max_new_tokens,
                                 stop_token_ids=[self.eos], seed=base + i, detokenize=False,
                                 logprobs=0 if with_logprobs else None) for i in range(len(prompts))]
        self.calls += 1
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        rows, lps = [], []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            if c.finish_reason == "stop" and (not ids or ids[-1] != self.eos):
                ids.append(self.eos)  # a version that strips the stop token: keep our convention (EOS is real)
            rows.append(ids)
            lps.append([d[t].logprob for t, d in zip(c.token_ids, c.logprobs)] if with_logprobs else [])
        width = max(1, max(len(r) for r in rows))
        response = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        logprobs = torch.zeros((len(rows), width)) if with_logprobs else None
        for i, (r, lp) in enumerate(zip(rows, lps)):
            response[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
            if logprobs is not None:
                logprobs[i, : len(lp)] = torch.tensor(lp)
        return response, mask, logprobs

    def sync_weights(self, policy: PreTrainedModel) -> int:
        """Load the policy's current weights into vLLM's copy, in place. Returns how many tensors were sent.

        Call after every update: a rollout from stale weights would be off-policy without the ratio showing it
        (the recomputed log-probs come from the new weights)."""
        state = [(k, v.detach()) for k, v in policy.state_dict().items()]
        self.llm.apply_model(lambda model: model.load_weights(iter(state)))
        self.llm.reset_prefix_cache()
        return len(state)

    def close(self) -> None:
        """Free the GPU memory, vLLM's process group (a later engine in this process makes its own) and the
        temporary checkpoint."""
        import gc

        import torch

        del self.llm
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        except ImportError:  # older layouts: the GPU memory is still freed below
            cleanup_dist_env_and_memory = None
        if cleanup_dist_env_and_memory is not None:
            cleanup_dist_env_and_memory()
        gc.collect()
        torch.cuda.empty_cache()
        self._dir.cleanup()
