"""`rlhf plan`: each stage's memory and time estimate (`rlhf_lib.memory`, `benchmarks.stage_time`) against one
device, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from flows.settings import load_config


def cmd_plan(args: argparse.Namespace) -> int:
    """Each stage's memory estimate (`rlhf_lib.memory`) against one device: exit 1, with each refusal, when a stage
    does not fit."""
    from rich.console import Console as RichConsole
    from rich.table import Table

    from cli.console import clock
    from rlhf_lib.memory import (
        GiB,
        MemoryBudgetError,
        check,
        device_budget,
        estimate,
        human,
        one_process_note,
        planned_stages,
    )
    from rlhf_lib.shapes import resolve_models

    sets = [*(args.set or []), *([f"model.name_or_path={args.shape}"] if args.shape else [])]
    cfg = load_config(args.preset, args.config, sets)
    budget = ((int(args.budget_gb * GiB), f"--budget-gb {args.budget_gb:g}") if args.budget_gb is not None
              else device_budget(cfg.resources))
    models = resolve_models(cfg)
    estimates = [estimate(cfg, stage, models) for stage in args.stage or planned_stages(cfg)]
    times = None
    if not args.no_time:
        from benchmarks.stage_time import estimate_times
        from rlhf_lib.shapes import model_configs

        times = estimate_times(cfg, *model_configs(cfg))
    refusals: dict[str, str] = {}
    for est in estimates:
        try:
            check(est, *budget) if budget else None
        except MemoryBudgetError as e:
            refusals[est.stage] = str(e)
    if args.json:
        print(json.dumps({"budget_bytes": budget[0] if budget else None, "budget": budget[1] if budget else None,
                          "stages": [est.to_dict() | {"fits": est.stage not in refusals} for est in estimates],
                          "time": times}))
    else:
        table = Table("stage", "weights", "grads", "Adam", "activations (peak phase)", "runtime", "total", "fits",
                      "time (est.)", "largest part", title=f"Memory of one device (GB = GiB), "
                      f"{cfg.resources.num_processes} process(es); budget: "
                      f"{f'{human(budget[0])} ({budget[1]})' if budget else 'none (no check)'}")
        for est in estimates:
            k, top = est.by_kind(), est.largest(1)[0]
            seconds = times["stages"][est.stage]["seconds"] if times else None
            table.add_row(est.stage, *(human(k[kind]) for kind in ("weights", "grads", "adam")),
                          f"{human(k['activations'])} ({est.peak_phase})", human(k["runtime"]), human(est.total),
                          "-" if not budget else "no" if est.stage in refusals else "yes",
                          "-" if seconds is None else clock(seconds), f"{top.kind}: {top.name} {human(top.bytes)}")
        out = RichConsole(highlight=False, width=160)
        out.print(", ".join(f"{role}: {n:,} parameters" for role, n in estimates[0].params.items())
                  + f"; trained weights in {models.dtype}, frozen in {cfg.resources.frozen_dtype}")
        out.print(table)
        if times:
            eff = ", ".join(f"{kind} {share:.0%}" for kind, share in times["efficiency"].items())
            out.print(f"time: FLOPs over a {times['roofline_gflops']:g} GFLOP/s roofline ({times['roofline']}, "
                      f"measured now) at the shares measured on a 2-core CPU ({eff}); token counts from "
                      f"{'the data' if times['lengths'] == 'data' else 'the configured caps (an upper bound)'}")
        if note := one_process_note(estimates, cfg.resources):
            out.print(note)
    for message in refusals.values():
        print(f"rlhf: out of memory: {message}", file=sys.stderr, flush=True)
    return 1 if refusals else 0
