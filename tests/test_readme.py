"""The README is a user's guide that tells the truth: its `rlhf` command lines parse and their configs validate, its
links resolve, and it stays short (the reference is docs/reference.md). Its `prefect deployment run` lines are run
against real services in tests/flows/test_deployments.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cli.main import parser
from flows.settings import load_config

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _command_lines(prog: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    lines = [ln.split("  #")[0].strip() for ln in text.splitlines()]
    return [ln.removeprefix(".venv/bin/") for ln in lines if ln.removeprefix(".venv/bin/").startswith(prog + " ")]


def test_the_readme_is_a_guide_not_a_notebook():
    assert len(README.splitlines()) <= 300


@pytest.mark.parametrize("line", _command_lines("rlhf"))
def test_every_rlhf_line_parses_and_its_config_validates(line):
    args = parser().parse_args(shlex.split(line)[1:])
    if args.command == "run":
        load_config(args.preset, str(ROOT / args.config) if args.config and (ROOT / args.config).exists() else None,
                    args.set or [])


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert links and [link for link in links if not (ROOT / link).exists()] == []
    for doc in (ROOT / "docs").glob("*.md"):
        text = doc.read_text()
        missing = [ln for ln in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text) if not (doc.parent / ln).exists()]
        assert missing == [], doc


def test_the_commands_table_names_real_commands():
    commands = set(re.findall(r"^\| `rlhf ([a-z][a-z-]*)", README, re.M))
    choices = re.search(r"\{([a-z,-]+)\}", parser().format_help()).group(1).split(",")
    assert commands and commands <= set(choices)
