"""The memory estimate against hand calculations: exact parameter counts on the meta device, PPO's weights, gradients
and Adam state of GPT-2 124M, the activation formulas, which knob shrinks which part, and the refusal."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.config import ConfigError, PipelineConfig
from rlhf_lib.memory import (
    CPU_HEAP_SLACK,
    on_cpu,
    CPU_PROCESS_BASE,
    GiB,
    MemoryBudgetError,
    check,
    estimate,
    out_of_memory,
    preflight,
)
from rlhf_lib.shapes import (
    SHAPES,
    forward_activations,
    fresh_gpt2_config,
    known_shape,
    kv_cache_bytes,
    logits_bytes,
    measure,
    model_config,
    resolve_models,
    trained_activations,
)

GPT2, GPT2_RM = 124_439_808, 124_440_576  # the causal LM (tied embeddings), and with a 768 -> 1 head instead


def config(**sections) -> PipelineConfig:
    """GPT-2 124M (a known shape: no download) at 1024 positions, over `sections`."""
    base = {"model": {"name_or_path": "gpt2", "n_positions": 1024}, "ppo": {"max_new_tokens": 256}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return PipelineConfig.model_validate(base)


def part(est, kind: str, name: str) -> int:
    return sum(c.bytes for c in est.components if c.kind == kind and c.name == name)


@pytest.mark.parametrize("shape, causal, scalar", [
    ("gpt2-124m", GPT2, GPT2_RM),
    # Pythia's output embedding is its own (untied): the scalar model drops 50304 x 1024 and adds a 1024 -> 1 head.
    ("pythia-160m", 162_322_944, 162_322_944 - 50304 * 768 + 768),
    ("pythia-410m", 405_334_016, 405_334_016 - 50304 * 1024 + 1024),
    ("qwen2.5-0.5b", 494_032_768, 494_032_768 + 896),
    ("qwen2.5-1.5b", 1_543_714_304, 1_543_714_304 + 1536),
])
def test_parameter_counts_on_the_meta_device_are_the_published_ones(shape, causal, scalar):
    cfg = model_config(shape, "model.name_or_path")
    assert measure(cfg, "causal").params == causal
    assert measure(cfg, "scalar").params == scalar


def test_qwen_shape_by_hand():
    # Qwen2.5-0.5B: embeddings 151936 x 896 (tied); per layer q 896x896+896, k and v 896x128+128 each, o 896x896,
    # MLP 3 x 896 x 4864, two RMSNorms 2 x 896; the final norm 896.
    per_layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    assert 151936 * 896 + 24 * per_layer + 896 == 494_032_768
    a = measure(model_config("Qwen/Qwen2.5-0.5B-Instruct", "model.name_or_path"), "causal", (8, None))
    assert (a.gated, a.kv_heads, a.head_dim, a.dtype) == (True, 2, 64, "bfloat16")
    assert a.lora_params == 24 * 8 * ((896 + 896) + (896 + 128))  # peft's default targets q_proj, v_proj


def test_shapes_resolve_by_hub_name_and_from_a_local_directory_offline(tmp_path):
    assert known_shape("EleutherAI/pythia-410m") is SHAPES["pythia-410m"]
    assert known_shape("someone/unknown") is None
    fresh_gpt2_config(300, 2, 4, 64, 128).save_pretrained(tmp_path)
    assert measure(model_config(str(tmp_path), "model.name_or_path"), "causal").params == measure(
        fresh_gpt2_config(300, 2, 4, 64, 128), "causal").params
    with pytest.raises(ConfigError, match="reward.name_or_path: cannot read the config of 'nobody/no-such-model'"):
        model_config("nobody/no-such-model", "reward.name_or_path")  # the tests run with HF_HUB_OFFLINE=1


def test_ppo_weights_gradients_and_adam_of_gpt2_124m_in_float32_by_hand():
    # Four models in float32: policy and reference (causal LM), reward and value model (scalar head), 4 bytes each.
    # Trained: policy and value model; a gradient (4 bytes) and Adam's two moments (8 bytes) per parameter.
    est = estimate(config(), "ppo")
    kinds = est.by_kind()
    assert kinds["weights"] == 4 * (2 * GPT2 + 2 * GPT2_RM) == 1_991_043_072  # 1.85 GiB
    assert kinds["grads"] == 4 * (GPT2 + GPT2_RM) == 995_521_536  # 0.93 GiB
    assert kinds["adam"] == 8 * (GPT2 + GPT2_RM) == 1_991_043_072  # 1.85 GiB
    assert est.total == sum(kinds.values())
    # The tests run on a CPU: the runtime term is the process's libraries, not a CUDA context.
    assert kinds["runtime"] == CPU_PROCESS_BASE
    assert estimate(config(resources={"device": "cuda"}), "ppo").by_kind()["runtime"] == GiB


def test_reward_rows_are_pairs_on_user_data():
    demo = estimate(config(), "reward")
    user = estimate(config(data={"preferences": "prefs.jsonl"}), "reward")
    act = {e: next(c.bytes for c in est.components if c.name == "reward model activations") for e, est in
           (("demo", demo), ("user", user))}
    assert act["demo"] == 2 * act["user"]  # the demo ranks K = 4 responses a list; user pairs are K = 2


def test_bf16_mixed_precision_halves_only_the_frozen_weights():
    # Trained weights and Adam stay float32 (model.dtype); reference and RM in bfloat16: 4P + 2P + 2R + 4R.
    est = estimate(config(resources={"mixed_precision": "bf16", "frozen_dtype": "bfloat16"}), "ppo")
    assert est.by_kind()["weights"] == 6 * (GPT2 + GPT2_RM) == 1_493_282_304
    assert est.by_kind()["adam"] == 8 * (GPT2 + GPT2_RM)


def test_activation_formulas_by_hand():
    a = measure(fresh_gpt2_config(50257, 12, 12, 768, 1024), "causal")
    # GPT-2 block: 4H norms + 2H (Q, out) + 2H (K, V) + 2 * 4H (MLP up, GELU) = 16H elements per token.
    assert a.layer_elements() == 16 * 768 and not a.rms_norm and not a.python_gelu
    # float32: e + 2H float32 elements a block; 2H float32 outside the blocks.
    assert trained_activations(a, 1000, 4, 4, False) == 1000 * (12 * (16 + 2) * 768 * 4 + 8 * 768)
    # autocast, checkpointed: each block's float32 input, one block recomputed (e in bf16, 2H LayerNorm float32).
    assert trained_activations(a, 1000, 2, 4, True) == 1000 * (12 * 768 * 4 + 16 * 768 * 2 + 2 * 768 * 4 + 6 * 768)
    assert forward_activations(a, 10, 2) == 10 * 17 * 768 * 2
    assert kv_cache_bytes(a, rows=4, length=100, act_bytes=2) == 2 * 12 * 12 * 64 * 4 * 100 * 2
    assert logits_bytes(2, 3, 50257, copies=4) == 2 * 3 * 50257 * 4 * 4


def test_lora_drops_the_reference_and_trains_only_adapters():
    base, lora = estimate(config(), "ppo"), estimate(config(ppo={"lora": True}), "ppo")
    assert part(base, "weights", "reference") == 4 * GPT2 and part(lora, "weights", "reference") == 0
    adapters = 12 * 8 * (768 + 3 * 768)  # c_attn of each block, rank 8: r * (fan_in + fan_out)
    assert part(lora, "grads", "policy") == 4 * adapters and part(lora, "adam", "policy") == 8 * adapters
    assert part(lora, "weights", "policy LoRA adapters") == 4 * adapters


@pytest.mark.parametrize("ppo", [{"advantage_estimator": "grpo"}, {"critic": "shared"}])
def test_critic_free_or_shared_critic_loads_no_value_model(ppo):
    est = estimate(config(ppo=ppo), "ppo")
    assert not [c for c in est.components if c.name.startswith("value model")]
    assert "update: value model" not in est.phases
    assert est.by_kind()["adam"] < estimate(config(), "ppo").by_kind()["adam"]


def test_frozen_dtype_halves_reference_and_reward_model():
    base, half = estimate(config(), "ppo"), estimate(config(resources={"frozen_dtype": "bfloat16"}), "ppo")
    for name in ("reference", "reward model"):
        assert 2 * part(half, "weights", name) == part(base, "weights", name)
    assert part(half, "weights", "policy") == part(base, "weights", "policy")


def test_checkpointing_chunking_and_micro_batches_lower_the_update_and_scoring_phases():
    base = estimate(config(), "ppo").phases
    ckpt = estimate(config(ppo={"gradient_checkpointing": True}), "ppo").phases
    assert ckpt["update: policy"] < base["update: policy"] and ckpt["sampling"] == base["sampling"]
    whole = estimate(config(ppo={"logprob_chunk": None}), "ppo").phases  # the default: the whole response
    chunked = estimate(config(ppo={"logprob_chunk": 64}), "ppo").phases
    small = estimate(config(ppo={"logprob_chunk": 16}), "ppo").phases
    assert small["update: policy"] < chunked["update: policy"] < whole["update: policy"] == base["update: policy"]
    assert small["score: reference"] < chunked["score: reference"] < base["score: reference"]
    micro = estimate(config(ppo={"micro_batch_tokens": 2048}), "ppo").phases  # 2 rows of 1024 instead of 16
    assert micro["update: policy"] < base["update: policy"] and micro["update: value model"] < base[
        "update: value model"]


def test_sft_logits_and_reward_lists_by_hand():
    cfg = config(sft={"batch_size": 2, "max_length": 512}, reward={"batch_size": 2, "max_length": 512})
    sft = estimate(cfg, "sft")
    assert part(sft, "activations", "logits") == 2 * 512 * 50257 * 4 * 4
    reward = estimate(cfg, "reward")  # 2 lists x K=4 responses of 512 tokens
    a = resolve_models(cfg).reward
    act = trained_activations(a, 8 * 512, 4, 4, False)
    assert reward.phases["training step"] == act + (int(CPU_HEAP_SLACK * act) if on_cpu(cfg.resources) else 0)


def test_on_a_cpu_training_phases_count_what_glibc_keeps():
    gpu = estimate(config(resources={"device": "cuda"}), "ppo")
    cpu = estimate(config(resources={"device": "cpu"}), "ppo")
    kept = part(cpu, "activations", "freed activations glibc keeps (CPU)")
    assert part(gpu, "activations", "freed activations glibc keeps (CPU)") == 0
    assert kept == int(CPU_HEAP_SLACK * part(cpu, "activations", "policy activations"))  # logits left out
    assert cpu.phases["score: reference"] == gpu.phases["score: reference"]  # no training, no slack


def test_refusal_names_the_largest_parts_and_their_keys():
    cfg = config(ppo={"batch_size": 256, "minibatches": 1})  # a 256-row micro-batch of 1024 tokens
    est = estimate(cfg, "ppo")
    with pytest.raises(MemoryBudgetError) as refused:
        check(est, 80 * GiB, "an 80 GB device")
    message = str(refused.value)
    assert isinstance(refused.value, ConfigError)
    assert "the ppo stage needs about" in message and "an 80 GB device has 80.00 GB" in message
    assert "ppo.micro_batch_tokens / ppo.gradient_accumulation_steps" in message
    assert "ppo.gradient_checkpointing" in message and "ppo.logprob_chunk" in message
    check(estimate(config(), "ppo"), 80 * GiB)  # the default batch fits


def test_preflight_checks_resources_memory_gb_and_skips_the_check_on_a_cpu():
    with pytest.raises(MemoryBudgetError, match=r"resources.memory_gb \(2\) has 2.00 GB"):
        preflight(config(resources={"memory_gb": 2}), "ppo", "cpu")
    assert preflight(config(resources={"device": "cpu"}), "ppo", "cpu") is None  # nothing to check against


def test_an_out_of_memory_error_becomes_a_refusal_naming_keys():
    est = estimate(config(), "ppo")
    error = out_of_memory(est, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."))
    assert isinstance(error, MemoryBudgetError)
    assert "ran out of device memory (CUDA out of memory. Tried to allocate 2.00 GiB.)" in str(error)
    assert "<- " in str(error)


def _saved_bytes_per_token(model, autocast: bool) -> float:
    """Bytes of the tensors autograd saves for the backward (parameters and autocast's weight copies left out: the
    difference between 8 and 4 rows of 64 tokens), per token."""
    import torch

    def saved(rows: int) -> int:
        seen: dict[int, int] = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(1, 500, (rows, 64), generator=torch.Generator().manual_seed(rows))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                model(input_ids=ids).logits.sum()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        return sum(n for ptr, n in seen.items() if ptr not in params)

    return (saved(8) - saved(4)) / (4 * 64)


@pytest.mark.parametrize("family", ["llama", "gpt2-gelu-new", "gpt2"])
@pytest.mark.parametrize("mode", ["float32", "autocast", "bfloat16"])
def test_trained_activations_match_what_autograd_saves(family, mode):
    # The formula against the tensors a training forward really keeps, on CPU (rlhf_lib.shapes.Arch.layer_bytes):
    # within 3 % (SDPA's per-head logsumexp and the int64 position ids are not counted).
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    if family == "llama":
        config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=500, pad_token_id=0)
        model_cls = LlamaForSequenceClassification
    else:
        config = GPT2Config(n_embd=256, n_inner=1024, n_layer=3, n_head=4, vocab_size=500, pad_token_id=0,
                            bos_token_id=0, eos_token_id=0, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                            activation_function="gelu_new" if family == "gpt2-gelu-new" else "gelu_pytorch_tanh")
        model_cls = GPT2ForSequenceClassification
    config.num_labels = 1
    config._attn_implementation = "sdpa"
    arch = measure(config, "scalar")
    assert arch.rms_norm == (family == "llama") and arch.python_gelu == (family == "gpt2-gelu-new")
    model = model_cls(config).train()
    if mode == "bfloat16":
        model = model.to(torch.bfloat16)
    act, weights = {"float32": (4, 4), "autocast": (2, 4), "bfloat16": (2, 2)}[mode]
    measured = _saved_bytes_per_token(model, mode == "autocast")
    formula = trained_activations(arch, 1, act, weights, False)
    assert abs(measured / formula - 1) <= 0.03, (measured, formula)


def test_one_process_on_a_cpu_plans_for_the_largest_stage():
    from rlhf_lib.memory import one_process_note

    cpu = config(resources={"device": "cpu"})
    ests = [estimate(cpu, stage) for stage in ("sft", "reward", "ppo", "eval")]
    top = max(ests, key=lambda e: e.total)
    note = one_process_note(ests, cpu.resources)
    assert note is not None and f"({top.stage})" in note and "rlhf run STAGE" in note
    assert one_process_note(ests[:1], cpu.resources) is None  # one stage: its own figure is the plan
    gpu = config(resources={"device": "cuda"})
    assert one_process_note([estimate(gpu, s) for s in ("sft", "reward")], gpu.resources) is None


def test_without_a_reward_model_nothing_of_one_is_planned():
    """Function rewards alone (the arithmetic task): no RM weights or forward in PPO and eval, no reward stage; with
    sft.max_steps 0, no SFT stage either."""
    from rlhf_lib.memory import planned_stages

    rewards = [{"name": "accuracy", "kind": "function", "function": "rlhf_lib.rewards.builtin:exact_match"}]
    cfg = config(ppo={"rewards": rewards})
    for stage in ("ppo", "eval"):
        est = estimate(cfg, stage)
        assert part(est, "weights", "reward model") == 0 and part(estimate(config(), stage), "weights", "reward model")
        assert not [name for name in est.phases if "reward" in name]
    assert planned_stages(cfg) == ("sft", "ppo", "eval") and planned_stages(config()) == ("sft", "reward", "ppo", "eval")
    assert planned_stages(config(ppo={"rewards": rewards}, sft={"max_steps": 0})) == ("ppo", "eval")


def test_dpo_by_hand_is_sft_on_twice_the_rows_and_planned_only_when_enabled():
    """A DPO step trains the policy on a chosen and a rejected row per pair: at batch B its activations and logits are
    SFT's at batch 2B of the same length; weights, gradients and Adam are the policy's once (the reference's log-probs
    come from one pass before training, no copy kept)."""
    from rlhf_lib.memory import planned_stages

    cfg = config(sft={"batch_size": 8, "max_length": 256}, dpo={"batch_size": 4, "max_length": 256,
                                                              "eval_batch_size": 16})
    dpo, sft = estimate(cfg, "dpo"), estimate(cfg, "sft")
    assert dpo.phases["training step"] == sft.phases["training step"]
    a = resolve_models(cfg).policy  # 16 held-out pairs = 32 rows at a time, no gradients: a forward and its logits
    assert dpo.phases["reference log-probs"] == forward_activations(a, 32 * 256, 4) + 32 * 256 * 50257 * 3 * 4
    for kind in ("weights", "grads", "adam"):
        assert part(dpo, kind, "policy") == part(sft, kind, "policy") == {"weights": 1, "grads": 1, "adam": 2}[kind] \
            * GPT2 * 4
    assert [c.name for c in dpo.components if c.kind == "weights"] == ["policy"]  # no reference copy
    assert "dpo" not in planned_stages(cfg)
    assert planned_stages(config(dpo={"enabled": True}))[-1] == "dpo"


def test_the_compiled_engine_plans_its_static_cache_for_a_bucket_of_left_padding():
    """ppo.rollout_engine=compiled rounds prompt widths up to 64 and keeps two graphs' static caches: the sampling KV
    cache of PPO (64 rows) and of the eval (eval.batch_size rows) is two caches of 1024 + 63 positions instead of one
    of 1024, by hand: 2 * 12 layers * 12 heads * 64 * rows * 4 bytes per position."""
    base, compiled = config(), config(ppo={"rollout_engine": "compiled"})
    for stage, rows in (("ppo", base.ppo.batch_size), ("eval", base.eval.batch_size)):
        extra = estimate(compiled, stage).phases["sampling"] - estimate(base, stage).phases["sampling"]
        assert extra == 2 * 12 * 12 * 64 * rows * 4 * (2 * (1024 + 63) - 1024), stage


def test_async_rollouts_plan_the_samplers_copy_the_weights_in_flight_and_its_cache_beside_each_phase():
    """ppo.async_rollouts.staleness s: one more policy (the sampler's) and s copies of the trained weights, by hand
    4 * GPT2 * (1 + s) bytes; the sampling phase's activations (KV cache, prompt forward, logits) added to every
    other phase, which the sampler thread runs beside (on a GPU: no CPU heap slack on the training phases)."""
    gpu = {"device": "cuda"}
    base = estimate(config(resources=gpu), "ppo")
    for s in (1, 2):
        est = estimate(config(ppo={"async_rollouts": {"staleness": s}}, resources=gpu), "ppo")
        assert est.by_kind()["weights"] - base.by_kind()["weights"] == 4 * GPT2 * (1 + s)
        assert est.phases["sampling"] == base.phases["sampling"]
        for phase in base.phases:
            if phase != "sampling":
                assert est.phases[phase] == base.phases[phase] + base.phases["sampling"], phase
