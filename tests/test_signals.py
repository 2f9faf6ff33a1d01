"""A SIGTERM that lands inside a library which wraps the handler's SystemExit in its own error (pydantic's serializer
did, while Prefect dumped its settings) still ends `rlhf` with 128 + 15, not with that error's exit code 1."""

from __future__ import annotations

import argparse
import signal

import pytest

import cli.main
import cli.signals


def test_a_wrapped_sigterm_still_exits_with_the_signals_code(monkeypatch):
    def wrapped(args):
        try:
            cli.signals.exit_on_sigterm(signal.SIGTERM, None)
        except SystemExit as e:
            raise ValueError("Error calling function `_ser_model`: SystemExit: 143") from e

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(fn=wrapped, debug=False)

    monkeypatch.setattr(cli.signals, "_RECEIVED", [])
    monkeypatch.setattr(cli.main, "parser", lambda: Parser())
    with pytest.raises(SystemExit) as info:
        cli.main.main([])
    assert info.value.code == 128 + 15
    assert signal.getsignal(signal.SIGTERM) is not cli.signals.exit_on_sigterm  # the handler is put back


def test_without_a_sigterm_an_error_is_the_usual_one_line(monkeypatch, capsys):
    from rlhf_lib.config import ConfigError

    def bad(args):
        raise ConfigError("ppo.lrr: no such key")

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(fn=bad, debug=False)

    monkeypatch.setattr(cli.signals, "_RECEIVED", [])
    monkeypatch.setattr(cli.main, "parser", lambda: Parser())
    assert cli.main.main([]) == 2 and "ppo.lrr" in capsys.readouterr().err
