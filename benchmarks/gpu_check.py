#!/usr/bin/env python3
"""GPU check, for the day a GPU is at hand (no test needs one). Five parts, one JSON summary ($OUT/gpu_check.json):

  (a) pipeline: `rlhf run full --preset micro` on the device against the same command on the CPU. The data, SFT and
      RM metrics must agree within ATOL + RTOL * |cpu| (float32: 1e-4 + 1e-3); PPO and eval metrics (sampled) and
      discrete ones (accuracies, win rates) are printed with their differences, not checked: the devices' random
      streams differ, and one flipped pair moves an 8-pair accuracy by 0.125.
  (b) bf16: the same run with resources.mixed_precision=bf16 against (a)'s float32 run on the device (1e-2 + 5e-2).
  (c) bench: `rlhf bench ppo` at GPT-2 124M shape (12 layers, d = 768, vocabulary 50,257), 64 prompts x 64 tokens,
      128 sampled each, weights in bf16 (`bench.dtype`, no float32 master copy: a throughput check, not a recipe):
      s/iteration, tokens/s, MFU of the update against --peak-tflops (default 989, dense bf16 of an H100/H200 SXM,
      when the device name says so; else the bf16 matmul roofline measured in the same process).
  (d) memory: `rlhf plan --json --stage ppo` for (c)'s config (its weights dtype everywhere), less the runtime reserve
      (CUDA context), against torch.cuda.max_memory_allocated of (c); reported, not in the exit status.
  (e) vLLM: benchmarks/gpu_vllm_check.sh, only where vllm is installed.

    bash benchmarks/gpu_check.sh                          # cuda; first says which packages are missing
    python benchmarks/gpu_check.py --device cpu --tiny    # every part at tiny size on the CPU (tests/benchmarks)

Exit status: 0 when (a)-(c) passed and (e) passed or was skipped, 1 when a check failed, 3 when incomplete (no CUDA,
or packages missing: a machine without a network cannot install them; the preflight names them).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch, pydantic and transformers are imported after the preflight, which may find them missing
    from benchmarks.config import BenchPipelineConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPT2_124M = {"model.n_layer": 12, "model.n_head": 12, "model.n_embd": 768, "model.vocab_size": 50257,
             "model.n_positions": 1024, "bench.prompt_length": 64, "ppo.max_new_tokens": 128, "ppo.batch_size": 64,
             "ppo.minibatches": 4, "bench.iterations": 6, "bench.warmup_iterations": 2}
TINY = {"model.n_layer": 1, "model.n_head": 2, "model.n_embd": 32, "model.vocab_size": 256, "model.n_positions": 64,
        "eval.max_new_tokens": 8, "bench.prompt_length": 8, "ppo.max_new_tokens": 8, "ppo.batch_size": 8,
        "ppo.minibatches": 2, "bench.num_prompts": 16, "bench.iterations": 2, "bench.warmup_iterations": 1}
# Import names: what (c) needs, and what the pipeline runs (a), (b), (d) need besides (pyproject.toml).
BENCH_MODULES = ("torch", "transformers", "tokenizers", "accelerate", "peft", "safetensors", "pydantic", "yaml",
                 "numpy")
PIPELINE_MODULES = ("prefect", "mlflow", "datasets", "pandas", "matplotlib", "psutil", "rich", "tenacity")
TOLERANCE = {"float32": (1e-4, 1e-3), "bf16": (1e-2, 5e-2)}  # (atol, rtol)
CHECKED_STAGES = ("data", "sft", "reward")  # no sampling before PPO
NOT_COMPARED = re.compile(r"^time/|_s$|seconds|per_s|mem|rss")  # timings and sizes of this machine
DISCRETE = re.compile(r"accuracy|win_rate|frac|_lead\b|baseline/|adversarial/")  # counts of pairs or prompts: one flips
PLAN_ARGV = ["plan", "--json", "--stage", "ppo", "--config"]  # + the config file: `rlhf plan` (rlhf_lib/memory.py)


def preflight(device: str) -> tuple[str | None, dict[str, list[str]]]:
    """A fatal problem (no torch, or no CUDA where asked for), and the missing packages of each part."""
    missing = {part: [m for m in mods if importlib.util.find_spec(m) is None]
               for part, mods in (("bench", BENCH_MODULES), ("pipeline", PIPELINE_MODULES))}
    found = [f"{m} {_version(m)}" for m in BENCH_MODULES + PIPELINE_MODULES if importlib.util.find_spec(m)]
    print(f"# python {sys.executable} ({sys.version.split()[0]}): {', '.join(found)}", flush=True)
    if "torch" in missing["bench"]:
        return "no torch in this python", missing
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no GPU is visible"
        return f"torch {torch.__version__} is {why}: nothing to check on cuda", missing
    return None, missing


def _version(module: str) -> str:
    name = {"yaml": "pyyaml"}.get(module, module)
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def start_run(tmp: Path, tag: str, device: str, sets: list[str]) -> subprocess.Popen:
    """`rlhf run full --preset micro --json` in its own state dir (MLflow store, Prefect home) under `tmp`."""
    home = tmp / tag
    home.mkdir(parents=True)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "RLHF_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    argv = [sys.executable, "-m", "cli.main", "run", "full", "--preset", "micro", "--json"]
    argv += [a for s in [f"resources.device={device}", *sets] for a in ("--set", s)]
    with open(home / "stderr.txt", "w") as log:  # the child keeps its own handle
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)


def finish_run(proc: subprocess.Popen, log: Path, timeout_s: float) -> dict:
    """The run's stage metrics {stage: {key: value}} read back from its MLflow store; {"error": ...} if it failed."""
    try:
        out, _ = proc.communicate(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {log.read_text()[-1500:]}"}
    from mlflow import MlflowClient

    summary = json.loads(out.strip().splitlines()[-1])
    client = MlflowClient(summary["mlflow_tracking_uri"])
    return {stage: {k: v for k, v in client.get_run(s["mlflow_run_id"]).data.metrics.items()
                    if not NOT_COMPARED.search(k)} for stage, s in summary["stages"].items() if s["mlflow_run_id"]}


def compare(name: str, ref: dict, got: dict, precision: str) -> dict:
    """Every metric both runs logged: |got - ref|, checked against the tolerance where deterministic and continuous."""
    if "error" in ref or "error" in got:
        print(f"{name}: FAILED: a run failed: {ref.get('error') or got.get('error')}", flush=True)
        return {"status": "failed", "error": ref.get("error") or got.get("error")}
    atol, rtol = TOLERANCE[precision]
    rows, failures = [], []
    for stage, metrics in ref.items():
        for key in sorted(set(metrics) & set(got.get(stage, {}))):
            a, b = metrics[key], got[stage][key]
            checked = stage in CHECKED_STAGES and not DISCRETE.search(key)
            ok = abs(b - a) <= atol + rtol * abs(a)
            rows.append({"stage": stage, "metric": key, "ref": a, "got": b, "abs_diff": abs(b - a), "checked": checked,
                         "ok": ok})
            if checked and not ok:
                failures.append(key)
    print(f"{name}: tolerance {atol:g} + {rtol:g} * |ref| on {len([r for r in rows if r['checked']])} data/SFT/RM "
          f"metrics; reported only: {len([r for r in rows if not r['checked']])} sampled or discrete", flush=True)
    for r in rows:
        if r["checked"] or not r["ok"]:
            flag = ("ok" if r["ok"] else "FAIL") if r["checked"] else "(sampled/discrete)"
            print(f"  {r['metric']:34s} ref {r['ref']:12.6g}  got {r['got']:12.6g}  diff {r['abs_diff']:9.3g}  {flag}")
    same = all(r["ok"] for r in rows if not r["checked"])
    why = "agree too" if same else "differ (other random streams, or rounding that flips one sampled token)"
    print(f"{name}: {'PASSED' if not failures else 'FAILED: ' + ', '.join(failures)}; sampled metrics {why}",
          flush=True)
    return {"status": "failed" if failures else "passed", "failures": failures, "tolerance": [atol, rtol],
            "sampled_agree": same, "rows": rows}


def bench(a: argparse.Namespace) -> tuple[BenchPipelineConfig, dict]:
    """(c): the benchmark's config and its summary (`benchmarks.ppo.bench_ppo`)."""
    import torch

    from benchmarks.config import PRESET_DIRS, BenchPipelineConfig
    from benchmarks.ppo import bench_ppo
    from flows.settings import load_config

    peak = a.peak_tflops
    if peak is None and a.device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        peak = 989.0 if any(g in name for g in ("H100", "H200")) else None
        print(f"# device: {name}; MFU against {f'{peak} TFLOP/s' if peak else 'the measured roofline'}", flush=True)
    sets = [f"{k}={v}" for k, v in (TINY if a.tiny else GPT2_124M).items()]
    sets += [f"bench.device={a.device}", f"bench.dtype={a.dtype}"] + ([f"bench.peak_tflops={peak}"] if peak else [])
    c = load_config("trl-baseline", None, sets + a.set, BenchPipelineConfig, PRESET_DIRS)
    s = bench_ppo(c)
    keys = ("s_per_iter_median", "tokens_per_s_end_to_end", "tokens_per_s_generate", "update_s_median",
            "mfu_update", "mfu_reference", "peak_gpu_mem_mib")
    print("(c) bench: " + ", ".join(f"{k}={s.get(k)}" for k in keys), flush=True)
    return c, {"status": "passed", **s}


def memory(c: BenchPipelineConfig, summary: dict, tmp: Path) -> dict:
    """(d): `rlhf plan`'s estimate for the bench config (its weights dtype everywhere) against the measured peak."""
    import yaml

    measured = summary.get("peak_gpu_mem_mib")
    if subprocess.run([sys.executable, "-m", "cli.main", "plan", "--help"], cwd=ROOT, capture_output=True,
                      check=False).returncode:
        print(f"(d) memory estimate: rlhf plan not available; measured peak {measured} MiB", flush=True)
        return {"status": "skipped", "reason": "rlhf plan not available", "measured_mib": measured}
    tree = c.model_dump(mode="json", exclude={"bench"})
    dtype = c.bench.dtype
    tree["model"]["dtype"], tree["resources"]["frozen_dtype"] = dtype, dtype
    tree["resources"].update(device=c.bench.device, mixed_precision="no")
    path = tmp / "plan.yaml"
    path.write_text(yaml.safe_dump(tree))
    got = subprocess.run([sys.executable, "-m", "cli.main", *PLAN_ARGV, str(path)], cwd=ROOT, capture_output=True,
                         text=True, check=False)
    if got.returncode:
        print(f"(d) memory estimate: rlhf plan failed: {got.stderr[-500:]}", flush=True)
        return {"status": "failed", "error": got.stderr[-1500:], "measured_mib": measured}
    (ppo,) = json.loads(got.stdout.strip().splitlines()[-1])["stages"]
    # max_memory_allocated counts the allocator's tensors only: not the CUDA context the plan reserves room for.
    estimate = (ppo["total_bytes"] - ppo["by_kind"].get("runtime", 0)) / 2**20
    ratio = estimate / measured if measured else None
    verdict = "n/a on the CPU" if ratio is None else ("covers it" if ratio >= 1 else "UNDERESTIMATES it")
    print(f"(d) memory: rlhf plan's PPO estimate without the runtime reserve {estimate:.0f} MiB (peak phase "
          f"{ppo['peak_phase']}); measured peak of (c) {measured} MiB: {verdict}"
          + (f" (ratio {ratio:.2f})" if ratio else ""), flush=True)
    return {"status": "passed" if ratio is None or ratio >= 1 else "underestimate", "estimate_mib": round(estimate, 1),
            "measured_mib": measured, "ratio": ratio, "plan": ppo}


def vllm_check(device: str, timeout_s: float) -> dict:
    """(e): benchmarks/gpu_vllm_check.sh where vllm is installed and a GPU is the device."""
    if not device.startswith("cuda") or importlib.util.find_spec("vllm") is None:
        print("(e) vLLM: skipped (not installed here, or not a CUDA device)", flush=True)
        return {"status": "skipped", "reason": "vllm not installed or not cuda"}
    try:
        got = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_vllm_check.sh")], cwd=ROOT, text=True,
                             capture_output=True, timeout=max(timeout_s, 1), check=False,
                             env={**os.environ, "PYTHON": sys.executable})
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {timeout_s:.0f} s"}
    passed = got.returncode == 0 and "GPU VLLM CHECK PASSED" in got.stdout
    print(f"(e) vLLM: {'PASSED' if passed else 'FAILED'}\n{got.stdout[-1500:]}{got.stderr[-1500:]}", flush=True)
    return {"status": "passed" if passed else "failed", "output": (got.stdout + got.stderr)[-3000:]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="(c)'s weights")
    p.add_argument("--tiny", action="store_true", help="(c) at a tiny size (CPU smoke test of this script)")
    p.add_argument("--peak-tflops", type=float, default=None, help="datasheet peak for (c)'s MFU")
    p.add_argument("--budget-s", type=float, default=450, help="wall-clock budget; later parts get what is left")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a `rlhf bench ppo` key for (c)")
    a = p.parse_args(argv)
    deadline = time.monotonic() + a.budget_s
    fatal, missing = preflight(a.device)
    report: dict = {"device": a.device, "missing": missing}
    for part, mods in missing.items():
        if mods:
            print(f"# missing for the {part} parts: {', '.join(mods)} (pip install -r requirements.lock)", flush=True)
    if fatal or missing["bench"]:
        print(f"gpu_check: INCOMPLETE: {fatal or 'packages missing'}", flush=True)
        return _finish({**report, "status": "incomplete", "error": fatal}, 3)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp_dir:
        tmp = Path(tmp_dir)
        if not missing["pipeline"]:  # (a) and (b): three runs at once, each with its own stores
            threads = f"torch_threads={max(1, min(4, (os.cpu_count() or 2) // 3))}"
            runs = {"device": start_run(tmp, "device", a.device, [threads]),
                    "bf16": start_run(tmp, "bf16", a.device, [threads, "resources.mixed_precision=bf16"]),
                    "cpu": start_run(tmp, "cpu", "cpu", [threads])}
            got = {k: finish_run(proc, tmp / k / "stderr.txt", deadline - time.monotonic() - 120)
                   for k, proc in runs.items()}
            report["pipeline"] = compare(f"(a) {a.device} vs cpu", got["cpu"], got["device"], "float32")
            if a.device != "cpu" and report["pipeline"].get("sampled_agree"):
                # The stages log no device. Sampling draws its uniforms on the CPU (`rlhf_lib.lm.generation`), so a
                # tiny model samples the same tokens on both devices; the checked float metrics tell the kernels
                # apart: all of them bit-equal to the CPU run's would mean the GPU was not used.
                moved = max((r["abs_diff"] for r in report["pipeline"]["rows"] if r["checked"]), default=0.0)
                print(f"(a) sampled metrics equal the CPU run's (uniforms drawn on the CPU); the SFT/RM float "
                      f"metrics differ by up to {moved:.3g}" + ("" if moved else ": WARNING: bit-equal, did "
                                                               "resources.device reach the stages?"))
            report["bf16"] = compare(f"(b) bf16 vs float32 on {a.device}", got["device"], got["bf16"], "bf16")
        try:
            c, report["bench"] = bench(a)
        except Exception as e:  # noqa: BLE001 - recorded in the summary, the remaining parts still run
            traceback.print_exc()
            c, report["bench"] = None, {"status": "failed", "error": f"{type(e).__name__}: {e}"[:1500]}
        report["memory"] = (memory(c, report["bench"], tmp) if c is not None and not missing["pipeline"] else
                            {"status": "skipped", "reason": "packages missing or (c) failed"})
        report["vllm"] = vllm_check(a.device, deadline - time.monotonic())
    parts = [report.get(k, {"status": "skipped"})["status"] for k in ("pipeline", "bf16", "bench")]
    status = "failed" if "failed" in parts + [report["vllm"]["status"]] else (
        "incomplete" if "skipped" in parts else "passed")
    print(f"gpu_check: {status.upper()} (a, b, c: {', '.join(parts)}; d: {report['memory']['status']}; "
          f"e: {report['vllm']['status']})", flush=True)
    return _finish({**report, "status": status}, {"passed": 0, "failed": 1, "incomplete": 3}[status])


def _finish(report: dict, code: int) -> int:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
