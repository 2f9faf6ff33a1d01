"""`EphemeralPrefect.stop` on a server still starting: it waits (bounded) for the server to answer before it
terminates it, so an early failure of the run (a device it lacks, a dead store) is not followed by the server's
traceback of a cancelled start-up query. The process and the health check are stand-ins: the order of calls is the
logic under test; the real server's start and stop run in the flow tests."""

from __future__ import annotations

from services import ephemeral


class FakeProcess:
    def __init__(self, log: list[str]):
        self.log, self.alive = log, True

    def poll(self):
        return None if self.alive else 0

    def terminate(self):
        self.log.append("terminate")
        self.alive = False

    def wait(self, timeout=None):
        return 0


def server(log: list[str], answers: list[bool], monkeypatch) -> ephemeral.EphemeralPrefect:
    def healthy(url, timeout=None):
        log.append("health")
        return answers.pop(0) if answers else answers_default[0]

    answers_default = [answers[-1]]
    monkeypatch.setattr(ephemeral, "healthy", healthy)
    s = object.__new__(ephemeral.EphemeralPrefect)
    s.api_url, s.up, s.process = "http://127.0.0.1:1/api", False, FakeProcess(log)
    return s


def test_a_starting_server_is_terminated_once_it_answers(monkeypatch):
    log: list[str] = []
    server(log, [False, False, True], monkeypatch).stop()
    assert log == ["health", "health", "health", "terminate"]


def test_a_server_that_never_answers_is_terminated_after_the_grace(monkeypatch):
    log: list[str] = []
    server(log, [False], monkeypatch).stop(start_grace_s=0.3)
    assert log[-1] == "terminate" and log.count("health") >= 2


def test_a_server_that_answered_before_is_terminated_at_once(monkeypatch):
    log: list[str] = []
    s = server(log, [True], monkeypatch)
    assert s.ready() and log == ["health"]
    s.stop()
    assert log == ["health", "terminate"]
