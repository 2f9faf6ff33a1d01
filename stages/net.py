"""Network helpers, in one place: a free local port, a TCP probe, and an HTTP health probe.

Requests go to our own servers: any HTTP(S)_PROXY in the environment is bypassed, since it would route (and usually
break) requests to loopback when `no_proxy` does not list the host.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
            return True
    except OSError:
        return False


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET, or None when nothing answers."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, OSError, ValueError):
        return None


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Whether `url` answers a GET with 200."""
    got = http_get(url, timeout_s)
    return got is not None and got[0] == 200


class ServiceUnreachable(ConnectionError):
    """A configured server does not answer; the message names its URL and what to do."""


class ArtifactNotFound(FileNotFoundError):
    """A model version, alias or artifact that is not in the store; the message names its URI."""


def require_healthy(base_url: str, what: str, hint: str, timeout_s: float = 5.0) -> None:
    """Fail within `timeout_s`, naming the URL, when `<base_url>/health` does not answer 200."""
    url = base_url.rstrip("/") + "/health"
    got = http_get(url, timeout_s)
    if got is None:
        raise ServiceUnreachable(f"the {what} at {base_url} is unreachable (no answer from {url} within "
                                 f"{timeout_s:.0f} s). {hint}")
    if got[0] != 200:
        raise ServiceUnreachable(f"the {what} at {base_url} answered {got[0]} on {url}. {hint}")
