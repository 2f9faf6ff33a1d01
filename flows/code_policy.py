"""Parameters are data, never code: what a pipeline run that arrives through a deployment (the Prefect API: a
flow run created by `prefect deployment run`, the UI, an HTTP client) may name.

Such a run chooses data, models and numbers. Five keys make the worker run code it was not installed with:
`model.trust_remote_code` and `reward.trust_remote_code` (a checkpoint's own Python files),
`ppo.rewards[].function` and `eval.judge.function` (any importable `module:function`, imported while the PPO or
eval cache key is computed) and
`ppo.environment` (a `module:Class` run at every rollout turn; the built-ins `calculator` and `one_op_calculator` are always allowed). A
deployment run may set them only where the host that runs it allows them in its own settings, never through a
parameter:

- `RLHF_ALLOW_CODE` in the environment of the worker (`rlhf serve`, `rlhf up`, a Prefect worker), and
- `<state>/allow-code.txt` (one entry per line, `#` comments),

each a list of entries: `model.trust_remote_code`, `reward.trust_remote_code`, `function:package.module:function`,
`function:package.module:*` (every function of that module), `environment:package.module:Class`. The project's own
reward functions
(`rlhf_lib.rewards.builtin`) are always allowed. `rlhf run` on the command line is the host itself: its config is
not checked. docs/operations.md ("Security") says the rest: Prefect API access means running pipelines.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlhf_lib.config import ConfigError, PipelineConfig
from rlhf_lib.envs import BUILTIN as BUILTIN_ENVIRONMENTS

ENV = "RLHF_ALLOW_CODE"
FILE_NAME = "allow-code.txt"
ALWAYS = ("function:rlhf_lib.rewards.builtin:*",)
# Every key that names code to run, with the allow-list entry that lets a deployment run set it (docs/operations.md's
# table is generated from this: flows/policy_docs.py). `code_requests` finds them in a config.
GATED = (
    ("model.trust_remote_code", "model.trust_remote_code", "the policy checkpoint's own Python files"),
    ("reward.trust_remote_code", "reward.trust_remote_code", "the reward checkpoint's own Python files"),
    ("ppo.rewards[].function", "function:pkg.mod:fn or function:pkg.mod:*", "a reward function, imported while "
     "the PPO cache key is computed"),
    ("eval.judge.function", "function:pkg.mod:fn or function:pkg.mod:*", "the eval's judge function"),
    ("ppo.environment", "environment:pkg.mod:Class or environment:pkg.mod:*", "an environment class run at every "
     "rollout turn (the built-ins `calculator` and `one_op_calculator` are always allowed)"),
)


def code_requests(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """(config key, entry that would allow it) for each key of `cfg` that names code to run."""
    out = [(f"{section}.trust_remote_code", f"{section}.trust_remote_code")
           for section in ("model", "reward") if getattr(cfg, section).trust_remote_code]
    out += [(f"ppo.rewards[{i}].function", f"function:{r.function}")
            for i, r in enumerate(cfg.ppo.rewards) if r.kind == "function" and r.function]
    if (judge := cfg.eval.judge) is not None and judge.kind == "function" and judge.function:
        out.append(("eval.judge.function", f"function:{judge.function}"))
    env = cfg.ppo.environment
    if env is not None and env not in BUILTIN_ENVIRONMENTS:
        out.append(("ppo.environment", f"environment:{env}"))
    return out


def host_allowed(state: Path) -> set[str]:
    """The host's allow-list: `RLHF_ALLOW_CODE` (comma- or space-separated) and `<state>/allow-code.txt`."""
    entries = set(os.environ.get(ENV, "").replace(",", " ").split())
    path = state / FILE_NAME
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            entries.update(line.split("#", 1)[0].split())
    return entries | set(ALWAYS)


def is_allowed(entry: str, allowed: set[str]) -> bool:
    """Whether `entry` is on the list, itself or (a function, an environment) by its module's `module:*`. A
    `module:*` entry allows what that module itself defines (a function, or for an environment a class), never a
    name it imported (`rlhf_lib.rewards.builtin:re`)."""
    if entry in allowed:
        return True
    for prefix in ("function:", "environment:"):
        if entry.startswith(prefix):
            module, _, name = entry.removeprefix(prefix).partition(":")
            return f"{prefix}{module}:*" in allowed and defined_in(module, name, prefix == "function:")
    return False


def defined_in(module: str, name: str, function: bool) -> bool:
    """Whether `module` itself defines `name` as a function (`function`) or a class: the module is one the host
    allowed (`module:*`), so importing it to look is what the run would do anyway."""
    import importlib
    import inspect

    try:
        obj = getattr(importlib.import_module(module), name, None)
    except Exception:  # a module that does not import: the run would fail on it too, naming it
        return False
    kind_ok = inspect.isfunction(obj) if function else inspect.isclass(obj)
    return kind_ok and getattr(obj, "__module__", None) == module


def check_deployment_config(cfg: PipelineConfig, state: Path) -> None:
    """Refuse, before any stage, a deployment run whose config names code the host has not allowed: a
    `ConfigError` naming each key and the entry that would allow it."""
    allowed = host_allowed(state)
    refused = [(key, entry) for key, entry in code_requests(cfg) if not is_allowed(entry, allowed)]
    if refused:
        keys = ", ".join(f"{key} ({entry})" for key, entry in refused)
        raise ConfigError(f"a deployment run may not name code to run: {keys}. Parameters choose data, models and "
                          f"numbers; the host that runs the flow allows code in its own settings ({ENV} or "
                          f"{state / FILE_NAME}), never through a parameter")
