#!/usr/bin/env python3
"""The reward model's learning curve: held-out accuracy against training pairs, with the cheap baselines at every
point (issue 57 item 3).

One SFT model (`rlhf run sft` with the preset, or `--sft-model`), then for each point N one `rlhf run reward` with
`data.max_train_rows=N` (the first N valid training rows), one epoch (`reward.max_steps=null`), and the held-out
file whole (`data.max_rows=null`), so every point is scored on the same held-out pairs. Each point's baselines (prefer
shorter, zero-shot log-likelihood, n-gram regression and linear probe, the last two trained on the same N pairs)
read the first `--baseline-pairs` held-out pairs, and the RM's lead over each is on those same pairs (its accuracy
there is a baseline's plus its lead); the RM's own accuracy column covers every held-out pair. The
settings are the preset's (for smollm2-hh: chosen on validation at 320 pairs, docs/data.md); a point's own choice on
validation is not made here. Prints a Markdown table after each point and writes --out as JSON.

    python benchmarks/rm_curve.py --preset smollm2-hh --points 160,320,640,1278 --home .rlhf-rm-curve \\
        --set resources.mixed_precision=no --set resources.frozen_dtype=float32    # a CPU without bf16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import rm_select  # noqa: E402  (the project root on the path first)

BASELINES = rm_select.BASELINES


def point_sets(n: int, baseline_pairs: int | None) -> list[str]:
    """The keys of the point with `n` training rows."""
    cap = [] if baseline_pairs is None else [f"reward.baseline_heldout_pairs={baseline_pairs}"]
    return [f"data.max_train_rows={n}", "data.max_rows=null", "reward.max_steps=null", "reward.epochs=1", *cap]


def on_baseline_pairs(got: dict) -> str:
    """The RM's accuracy on the pairs the baselines read: any baseline's accuracy plus the RM's lead over it there."""
    for b, v in got["baselines"].items():
        if v is not None and got["leads"].get(b) is not None:
            return f"{v + got['leads'][b]:.3f}"
    return "n/a"


def row(n: int, got: dict) -> dict:
    if "error" in got:
        return {"training rows": n, "error": got["error"][-200:]}
    lo, hi = got["ci95"]
    steps = got.get("steps")
    return {"training rows": n, "steps": int(steps) if steps else "n/a",
            "RM accuracy, all held-out pairs [95 %]": f"{got['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]",
            "RM on the baselines' pairs": on_baseline_pairs(got),
            **{f"{b} (RM's lead)": (f"{v:.3f} ({got['leads'][b]:+.3f})" if v is not None else "n/a")
               for b, v in got["baselines"].items()},
            "seconds": got["seconds"]}


def markdown(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(c for r in rows for c in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm2-hh")
    ap.add_argument("--points", default="160,320,640,1278", help="training rows per point, comma-separated")
    ap.add_argument("--test", default="data/hh-harmless/test.jsonl", help="the held-out pairs of every point")
    ap.add_argument("--baseline-pairs", type=int, default=160,
                    help="held-out pairs the baselines read (reward.baseline_heldout_pairs); 0 = all")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    ap.add_argument("--sft-model", help="SFT model URI (skips the sft run)")
    ap.add_argument("--home", default=".rlhf-rm-curve", help="state dir shared by the runs")
    ap.add_argument("--out", help="write the JSON result here (after every point)")
    a = ap.parse_args(argv)
    home = Path(a.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    result: dict = {"preset": a.preset, "sets": a.set, "test": a.test, "points": {}}
    sft = a.sft_model
    if sft is None:
        summary, seconds = rm_select.run_stage("sft", a.preset, a.set, a.test, home, home / "sft.log")
        if summary is None:
            sys.exit(f"rlhf run sft failed; the log {home / 'sft.log'} ends:\n{(home / 'sft.log').read_text()[-1500:]}")
        sft = f"runs:/{summary['stages']['sft']['mlflow_run_id']}/model"
        result["sft_seconds"] = round(seconds, 1)
        print(f"SFT model {sft} ({seconds:.0f} s)", flush=True)
    result["sft_model"] = sft
    rm_select.SFT_MODEL[:] = ["--sft-model", sft]
    rows = []
    for n in (int(p) for p in a.points.split(",")):
        t0 = time.monotonic()
        got = rm_select.run_reward(a.preset, [*a.set, *point_sets(n, a.baseline_pairs or None)], a.test, home,
                                   home / f"reward-{n}.log")
        got.setdefault("seconds", round(time.monotonic() - t0, 1))
        result["points"][str(n)] = got
        rows.append(row(n, got))
        print(markdown(rows) + "\n", flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
