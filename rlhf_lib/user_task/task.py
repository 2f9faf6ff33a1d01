"""User data behind the task protocol (`rlhf_lib.task_protocol.Task`): every source read in its format
(`rlhf_lib.data.user`), conversational rows rendered with the policy's chat template, bad rows refused or skipped
and counted. No gold judge: the eval's judge is `eval.judge` (a model PPO never optimised) or the RM."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlhf_lib.data import file_fingerprint, write_jsonl
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.sources import Source, hub_fingerprint
from rlhf_lib.data.user import build_user_task
from rlhf_lib.task_protocol import BaseTask, BuiltData, Digests

SOURCES = ("preferences", "eval_preferences", "sft", "prompts", "eval_prompts")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


class UserTask(BaseTask):
    name = "user"

    def identity(self, cfg, digests: Digests) -> tuple[dict[str, Any], str]:
        """The data keys and the policy's model (its chat template renders conversational rows); the fingerprint is
        the content of each source: a local file's or folder's bytes, `datasets`' fingerprint of a hub data set."""
        d, m = cfg.data, cfg.model
        parts = {}
        for key in SOURCES:
            if spec := getattr(d, key):
                split = d.eval_split if key.startswith("eval_") else d.split
                src = Source(spec, split, d.hub_data_dir, d.hub_revision)
                kind = src.kind
                parts[key] = (file_fingerprint(src.path) if kind in ("jsonl", "file")
                              else digests.folder(src.path) if kind == "dir" else "hub:" + hub_fingerprint(src))
        parts["model"] = digests.model(m.name_or_path, m.revision)
        section = {"data": d.key(),
                   "model": {"name_or_path": m.name_or_path, "revision": m.revision,
                             "trust_remote_code": m.trust_remote_code}}
        return section, "user:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def build(self, cfg, out_dir: Path, renderer) -> BuiltData:
        task = build_user_task(cfg.data, renderer)
        paths = {key: write_jsonl(out_dir / FILE_NAMES[key], rows) for key, rows in task.records.items()}
        name = Source(cfg.data.preferences).name
        metrics: dict[str, float] = {f"data/dropped_heldout_{k}": v for k, v in task.dropped.items()}
        warnings = []
        for key, report in task.sources.items():
            metrics[f"data/skipped_{key}"] = sum(report.skipped.values())
            metrics |= {f"data/skipped_{key}/{_slug(reason)}": n for reason, n in report.skipped.items()}
            if report.skipped:
                warnings.append(f"data: skipped {sum(report.skipped.values())} bad rows of {report.source}: "
                                f"{report.skipped}")
        source = {"source": "user", "judge": None, "name": name, "rows": None,
                  "sources": {key: asdict(report) for key, report in task.sources.items()},
                  "dropped_heldout": task.dropped, "rendering": task.rendering}
        tags = ({f"rlhf.data.{k}_format": r.format for k, r in task.sources.items()}
                | {"rlhf.data.rendering": task.rendering or "text"})
        # The conversation of each rendered prompt, for a reward model that renders with its own template.
        return BuiltData(paths, name, source, metrics, tags, renderer.conversations, tuple(warnings))


TASK = UserTask()
