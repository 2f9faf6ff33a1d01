"""The `rlhf` command: run pipelines in-process, serve the deployments, manage the local services.

Environment defaults are set before Prefect is imported (it reads its settings at import): everything goes under
the state dir (`$RLHF_HOME`, else `./.rlhf`) unless `PREFECT_HOME`, `PREFECT_API_URL` or `MLFLOW_TRACKING_URI`
say otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PIPELINES = ("full", "sft", "reward", "ppo", "eval")
DEPLOYMENTS = PIPELINES


def state_dir() -> Path:
    return Path(os.environ.get("RLHF_HOME") or Path.cwd() / ".rlhf").resolve()


def configure_env(use_services: bool = True) -> Path:
    state = state_dir()
    os.environ["RLHF_HOME"] = str(state)
    os.environ.setdefault("PREFECT_HOME", str(state / "prefect"))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect does not create parents
    # The analytics ping makes concurrent server starts fail with "database is locked".
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if use_services and "PREFECT_API_URL" not in os.environ:
        from flows.services import running_prefect_api

        api = running_prefect_api(state)
        if api:  # `rlhf up` is running: show this run in its UI instead of a throwaway ephemeral server
            os.environ["PREFECT_API_URL"] = api
    return state


def preset_layer(name: str) -> tuple[str, dict]:
    import yaml

    files = Path(__file__).parent / "presets"
    path = files / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".yaml") for p in files.iterdir() if p.name.endswith(".yaml"))
        raise SystemExit(f"rlhf: unknown preset {name!r}; known presets: {', '.join(known)}")
    return f"preset {name}", yaml.safe_load(path.read_text()) or {}


def file_layer(path: str) -> tuple[str, dict]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"rlhf: config file {path} does not exist")
    try:
        return str(p), yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SystemExit(f"rlhf: {path}: invalid YAML: {e}") from None


def load_config(preset: str, config_file: str | None, sets: list[str]):
    from rlhf_lib.config import ConfigError, build_config

    layers = [preset_layer(preset)] + ([file_layer(config_file)] if config_file else [])
    try:
        return build_config(layers, sets)
    except ConfigError as e:
        raise SystemExit(f"rlhf: bad config:\n{e}") from None


def check_prefect(api_url: str, timeout_s: float = 5.0) -> None:
    """Fail within seconds, naming the URL, when the configured Prefect API does not answer (no hang)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=timeout_s) as resp:
            if resp.status == 200:
                return
    except (urllib.error.URLError, OSError) as e:
        raise SystemExit(f"rlhf: the Prefect API at {api_url} is unreachable ({e}). Start it with `rlhf up`, or "
                         "unset PREFECT_API_URL to use a throwaway local server.") from None
    raise SystemExit(f"rlhf: the Prefect API at {api_url} did not answer its health check")


def start_prefect():
    """Make sure a Prefect API is there for this process; returns the settings to run flows under.

    Without `PREFECT_API_URL` (and no `rlhf up`), a throwaway server starts on the other core while this process
    imports torch and Prefect; call `.wait()` on the returned server before the first flow.
    """
    if os.environ.get("PREFECT_API_URL"):
        check_prefect(os.environ["PREFECT_API_URL"])
        return None
    from flows.ephemeral import EphemeralPrefect

    server = EphemeralPrefect()
    os.environ["PREFECT_API_URL"] = server.api_url
    return server


def flow_settings(server):
    """Heartbeats let a long-lived server mark crashed runs; the throwaway server dies with this process, so they
    would only cost each sub-flow up to a second at exit."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if server:
        server.wait()  # it stops at exit, after Prefect's own exit hooks have flushed logs and events to it
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None} if server else {})


def cmd_run(args: argparse.Namespace) -> int:
    cfg = load_config(args.preset, args.config, args.set or [])
    configure_env()
    server = start_prefect()
    from rlhf_lib.process import configure_process

    configure_process(cfg.torch_threads)
    from flows.pipeline import rlhf
    from rlhf_lib.data import DataError

    with flow_settings(server):
        try:
            summary = rlhf(config=cfg, pipeline=args.pipeline, force=args.force or [], sft_model=args.sft_model,
                           reward_model=args.reward_model)
        except DataError as e:  # a bad data row or source: the message names file, line and field
            raise SystemExit(f"rlhf: bad data: {e}") from None
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        _print_summary(summary)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    results: dict = {}
    if args.which in ("all", "ppo"):  # bare, before any Prefect server competes for the cores
        from flows.bench_ppo import bench_ppo

        ppo = bench_ppo(args.set or [])
        results = ppo if args.which == "ppo" else {"ppo": ppo}
    elif args.set:
        raise SystemExit("rlhf bench: --set applies to `rlhf bench ppo` only")
    if args.which != "ppo":
        configure_env(use_services=False)
        server = start_prefect()
        from flows.bench import run_benchmarks

        with flow_settings(server):
            results.update(run_benchmarks(args.which, iterations=args.iterations))
    if args.json:
        print(json.dumps(results, separators=(",", ":")), flush=True)
    return 0


def _print_summary(summary: dict) -> None:
    print(f"pipeline {summary['pipeline']}: {summary['status']} in {summary['seconds']} s")
    for stage, s in summary["stages"].items():
        print(f"  {stage:7s} {s['status']:7s} {s['seconds']:7.1f} s  {s.get('model_uri') or s['mlflow_run_id']}")
    for k, v in (summary.get("eval") or {}).items():
        print(f"  eval.{k} = {v if v is None else round(v, 4)}")
    print(f"MLflow: {summary['mlflow_tracking_uri']} (parent run {summary['mlflow_run_id']})")


def cmd_serve(args: argparse.Namespace) -> int:
    configure_env(use_services=False)
    from prefect import serve

    from flows.pipeline import rlhf

    cfg = load_config(args.preset, None, [])
    deployments = [
        rlhf.to_deployment(name=name, parameters={"pipeline": name, "config": cfg.model_dump()},
                           description=f"RLHF pipeline up to its {name} stage (preset {args.preset}).",
                           tags=["rlhf"])
        for name in DEPLOYMENTS
    ]
    serve(*deployments, print_starting_message=True)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    state = configure_env(use_services=False)
    from flows.services import up

    urls = up(state)
    print(f"Prefect UI: {urls['prefect_ui']}\nMLflow UI:  {urls['mlflow_ui']}\nlogs: {state / 'services'}")
    host = os.environ.get("RLHF_HOST", "127.0.0.1")
    loopback = " (loopback; set RLHF_HOST to serve other machines)" if host == "127.0.0.1" else ""
    print(f"bound to {host} only{loopback}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    state = configure_env(use_services=False)
    from flows.services import down

    stopped = down(state)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = configure_env(use_services=False)
    from flows.services import status

    for name, s in status(state).items():
        print(f"{name:8s} pid={s.get('pid')} alive={s.get('alive')} healthy={s.get('healthy')} {s.get('url', '')}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """`make demo`: services up, `prefect deployment run rlhf/full --watch`, then where to look."""
    state = configure_env(use_services=False)
    from flows.services import up

    urls = up(state)
    env = {**os.environ, "PREFECT_API_URL": urls["prefect_api"]}
    cmd = [sys.executable, "-m", "prefect", "deployment", "run", "rlhf/full", "--watch"]
    rc = subprocess.call(cmd, env=env)
    print(f"\nPrefect UI: {urls['prefect_ui']}  (flow runs of `rlhf`, with the ppo sub-flow and its tasks)")
    print(f"MLflow UI:  {urls['mlflow_ui']}  (experiment `rlhf`, models rlhf-sft / rlhf-reward / rlhf-policy)")
    print("Stop the services with `make down`.")
    return rc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlhf", description="A reproducible RLHF pipeline of cached stages.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a pipeline in-process (no servers needed)")
    r.add_argument("pipeline", choices=PIPELINES, help="the last stage to run; upstream stages run or are cached")
    r.add_argument("--preset", default="demo", help="named preset: demo (default) or micro")
    r.add_argument("--config", help="YAML file merged over the preset")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one key, e.g. ppo.kl_coef=0.1")
    r.add_argument("--force", action="append", metavar="STAGE", help="recompute STAGE even on a cache hit")
    r.add_argument("--sft-model", metavar="URI", help="use this SFT model instead of the sft stage")
    r.add_argument("--reward-model", metavar="URI", help="use this reward model instead of the reward stage, "
                   "e.g. models:/rlhf-reward/3, models:/rlhf-reward@champion or runs:/<run id>/model")
    r.add_argument("--json", action="store_true", help="print one JSON summary as the last stdout line")
    r.set_defaults(fn=cmd_run)
    b = sub.add_parser("bench", help="print performance figures (no timed tests: numbers to read)")
    b.add_argument("which", nargs="?", choices=("all", "ppo", "overhead", "cached"), default="all",
                   help="ppo: bare PPO iterations on the TRL baseline's config; overhead: Prefect tasks vs the bare "
                   "PPO loop; cached: a fully cached `rlhf run full`")
    b.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="bench ppo: override one key, e.g. iterations=10 or device=cuda")
    b.add_argument("--iterations", type=int, default=10, help="PPO iterations measured per side (overhead)")
    b.add_argument("--json", action="store_true", help="print the figures as one JSON object on the last line")
    b.set_defaults(fn=cmd_bench)
    s = sub.add_parser("serve", help="serve the deployments rlhf/full, ppo, sft, reward, eval")
    s.add_argument("--preset", default="demo", help="the config the deployments default to")
    s.set_defaults(fn=cmd_serve)
    for name, fn, text in (("up", cmd_up, "start the Prefect server, MLflow server and deployments"),
                           ("down", cmd_down, "stop the local services"),
                           ("status", cmd_status, "show the local services"),
                           ("demo", cmd_demo, "services up, run rlhf/full, print where to look")):
        sub.add_parser(name, help=text).set_defaults(fn=fn)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
