"""The environment protocol of multi-turn rollouts (docs/environments.md): reset from a prompt row, then step on each
of the policy's messages, answering with an observation, a reward and whether the episode is over.

    env = Factory()                        # one per rollout row, fresh for every episode
    env.reset(row)                         # row: the prompt's fields, {"prompt": ..., "answer": ..., ...}
    step = env.step(message)               # message: the policy's turn as text, without its EOS
    step.observation                       # the environment's reply (a tool result), read by the next policy turn
    step.reward, step.done

The rewards of an episode sum into the row's `environment` reward source, which lands on the last policy token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class Step:
    """What the environment answers to one policy message."""

    observation: str | None  # None when the episode is over
    reward: float = 0.0
    done: bool = False


@dataclass(frozen=True)
class Turn:
    """One turn of an episode as text, for the report: who spoke, what, and the reward the environment gave for it
    (policy turns only)."""

    role: Literal["policy", "environment"]
    text: str
    reward: float | None = None
    failed: bool = False  # a policy turn whose environment step raised: the episode read an error observation

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "text": self.text, "reward": self.reward} | ({"failed": True} if self.failed else {})


class Environment(Protocol):
    """A multi-turn environment. Instances are not shared between rows or episodes."""

    def reset(self, row: Mapping[str, Any]) -> None: ...

    def step(self, message: str) -> Step: ...


def safe_step(env: Environment, message: str) -> tuple[Step, bool]:
    """`env.step(message)`, and whether it raised: an exception from one episode's step (a bug, a value the
    environment did not expect) becomes an error observation for that episode, never a dead batch. Shapes: none."""
    try:
        return env.step(message), False
    except Exception as e:  # noqa: BLE001 - any failure of one episode's step is that episode's
        return Step(f"error: the environment failed on this message ({type(e).__name__})"), True


def format_turns(turns: list[Turn]) -> str:
    """An episode on one line per turn: `policy: <call> | tool: 85 | policy: 85. (reward 1)`."""
    parts = []
    for t in turns:
        who = "tool" if t.role == "environment" else "policy"
        reward = "" if t.reward is None or (t.reward == 0 and t is not turns[-1]) else f" (reward {t.reward:g})"
        parts.append(f"{who}: {t.text.strip()}{reward}")
    return " | ".join(parts)
