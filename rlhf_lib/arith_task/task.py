"""The arithmetic task behind the task protocol (`rlhf_lib.task_protocol.Task`): questions with a verifiable answer
(the `answer` column, read by the exact-match reward or the calculator environment), rendered with a pretrained
policy's chat template where it has one. No gold judge, groups or constant reply: its eval groups come from its
columns (`eval.group_by`), its baselines from best-of-n and the controls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf_lib.task_protocol import BaseTask, BuiltData, Digests

from .builder import build_arithmetic_task, summarize


class ArithmeticTask(BaseTask):
    name = "arithmetic"
    split_digits = True  # "37 + 48" read digit by digit, as in the Llama and Qwen tokenizers

    def identity(self, cfg, digests: Digests) -> tuple[dict[str, Any], str]:
        """The data keys; rendered by a pretrained policy's chat template, that model's identity too."""
        m = cfg.model
        section, fingerprint = {"data": cfg.data.key()}, "arithmetic"
        if m.name_or_path and cfg.data.render != "text":
            section["model"] = {"name_or_path": m.name_or_path, "revision": m.revision,
                                "trust_remote_code": m.trust_remote_code}
            fingerprint += ":" + digests.model(m.name_or_path, m.revision)
        return section, fingerprint

    def build(self, cfg, out_dir: Path, renderer) -> BuiltData:
        paths = build_arithmetic_task(cfg.data, out_dir, renderer)
        templated = renderer.templated()
        # No gold judge: the answer column is the ground truth. The statistics go to source.json rather than
        # metrics: they only confirm what the config asked for.
        return BuiltData(paths, "arithmetic", {"source": "arithmetic", "judge": None, "name": "arithmetic",
                                               "rows": None, "reward": "rlhf_lib.rewards.builtin:exact_match",
                                               "stats": summarize(paths)},
                         tags={"rlhf.data.rendering": "chat_template" if templated else "text"},
                         conversations=renderer.conversations if templated else None)


TASK = ArithmeticTask()
