"""`rlhf bench`: the same config keys as `rlhf run` plus `bench.*`, and TRL's key names in the JSON (the GPU check
script: test_gpu_check.py)."""

from __future__ import annotations

import json

import torch

from cli.main import main

TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.vocab_size=256", "model.n_positions=32",
        "bench.prompt_length=8", "ppo.max_new_tokens=4", "ppo.batch_size=4", "ppo.minibatches=2",
        "bench.num_prompts=8", "bench.iterations=2", "eval.max_new_tokens=4", "torch_threads=1"]
# The figures both sides of benchmarks/side_by_side.py report, named as trl_ppo_baseline.py names them.
TRL_KEYS = {"s_per_iter_median", "s_per_iter_min", "s_per_iter_max", "tokens_per_s_end_to_end", "peak_rss_mib",
            "generate_s_median", "rollout_score_s_median", "update_s_median", "cpu_s_per_iter_median",
            "quiet_iterations", "measured_iterations", "optimizer_steps_per_iter"}


def test_bench_ppo_json_is_the_last_line_with_trl_key_names(capsys):
    sets = [a for s in TINY for a in ("--set", s)]
    threads = torch.get_num_threads()
    try:
        assert main(["bench", "ppo", "--json", *sets]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark sets its own, once per process
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert TRL_KEYS <= set(summary)
    assert summary["iterations"] == 2 and summary["measured_iterations"] == 1
    assert summary["gen_tokens_per_iter"] == 4 * 4
    assert summary["optimizer_steps_per_iter"] == 2
    assert any(line.startswith("iter   2") for line in out)


def test_a_bad_key_is_one_line_naming_it(capsys):
    assert main(["bench", "ppo", "--set", "bench.iterationz=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'bench.iterationz'" in err and "Traceback" not in err


def test_bench_ppo_runs_the_precision_of_rlhf_run(capsys, monkeypatch):
    """resources.mixed_precision and resources.frozen_dtype reach the trainer, as in `rlhf run ppo`."""
    import benchmarks.ppo as bench

    seen = {}
    real = bench.PPOTrainer

    def spy(*args, **kwargs):
        trainer = real(*args, **kwargs)
        seen["frozen"] = {p.dtype for m in (trainer.models.ref, trainer.models.reward) for p in m.parameters()}
        seen["autocast"] = trainer.recompute_logprobs  # true only under autocast
        return trainer

    monkeypatch.setattr(bench, "PPOTrainer", spy)
    sets = [a for s in TINY + ["resources.mixed_precision=bf16", "resources.frozen_dtype=bfloat16"]
            for a in ("--set", s)]
    threads = torch.get_num_threads()
    try:
        assert main(["bench", "ppo", *sets]) == 0
    finally:
        torch.set_num_threads(threads)
    assert seen == {"frozen": {torch.bfloat16}, "autocast": True}
    assert "bf16 autocast, frozen models in bfloat16" in capsys.readouterr().out
