"""Multi-turn environments (docs/environments.md): the protocol, the built-in calculator, the registry, the format of
observations and (`rlhf_lib.envs.episodes`, imported by itself so that building data never loads the sampling code)
the rollout loop that interleaves policy and environment turns."""

from __future__ import annotations

from rlhf_lib.envs.base import Environment, Step, Turn, format_turns
from rlhf_lib.envs.registry import BUILTIN, EnvError, environment_digest, load_environment, resolve
from rlhf_lib.envs.render import ObservationFormat, is_transcript, transcript_observation

__all__ = ["BUILTIN", "EnvError", "Environment", "ObservationFormat", "Step", "Turn", "environment_digest",
           "format_turns", "is_transcript", "load_environment", "resolve", "transcript_observation"]
