"""Which environments a run may use, and the digest of their code (part of the PPO and eval cache keys).

`ppo.environment` names a built-in environment (`calculator`) or a class `package.module:Class`. Parameters are
data, never code: a deployment run may name a class only where the host allows it in its own settings
(`environment:package.module:Class` in RLHF_ALLOW_CODE or <state>/allow-code.txt; `flows/code_policy.py`); the
built-ins are always allowed.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
from collections.abc import Callable

from rlhf_lib.envs.base import Environment

BUILTIN = {"calculator": "rlhf_lib.envs.calculator:CalculatorEnv",
           "one_op_calculator": "rlhf_lib.envs.calculator:OneOpCalculatorEnv"}
SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class EnvError(ValueError):
    """An environment that cannot be found or built; the message names `ppo.environment` and the spec."""


def resolve(name: str) -> str:
    """The `package.module:Class` of a built-in name or of a spec; `EnvError` for anything else."""
    spec = BUILTIN.get(name, name)
    if not SPEC.match(spec):
        raise EnvError(f"ppo.environment {name!r}: expected a built-in ({', '.join(sorted(BUILTIN))}) or "
                                "package.module:Class")
    return spec


def load_environment(name: str) -> Callable[[], Environment]:
    """The factory (the class) of `name`: one instance per rollout row and episode."""
    spec = resolve(name)
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module's own code failing at import
        raise EnvError(f"ppo.environment {name!r}: cannot import {module_name!r}: "
                                f"{type(e).__name__}: {e}") from e
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise EnvError(f"ppo.environment {name!r}: {module_name!r} has no class {attr!r}")
    missing = [m for m in ("reset", "step") if not callable(getattr(factory, m, None))]
    if missing:
        raise EnvError(f"ppo.environment {name!r}: {spec} lacks {', '.join(missing)} "
                                "(rlhf_lib/envs/base.py: Environment)")
    return factory


def environment_digest(name: str | None) -> str | None:
    """SHA-256 of the environment's module source: an edited environment reruns PPO and eval. None without one."""
    if name is None:
        return None
    factory = load_environment(name)
    try:
        text = inspect.getsource(inspect.getmodule(factory))
    except (OSError, TypeError):
        text = f"{factory.__module__}.{factory.__qualname__}"
    return hashlib.sha256(text.encode()).hexdigest()
