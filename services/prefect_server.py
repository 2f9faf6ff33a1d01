"""The Prefect API servers this project starts (`rlhf up`'s and `rlhf run`'s throwaway one): Prefect's own app, behind
a check of the `Host` header. A server on 127.0.0.1 is still reachable from a web page through DNS rebinding (a name
that resolves to 127.0.0.1 after the page loaded); the browser then sends that name as the Host, which this refuses
with 400. Allowed: the loopback names, the `--host` the server binds, and the names in `RLHF_ALLOWED_HOSTS`
(comma-separated: the name a reverse proxy or other machines use).

Run as `uvicorn --factory services.prefect_server:create_app`; Prefect's settings in the environment (home, database,
UI, ephemeral or final) apply as they do to `prefect server start`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def allowed_hosts(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The Host names the server answers: loopback, `RLHF_BIND_HOST` (set by the launcher to `--host`) unless it is
    a wildcard, and `RLHF_ALLOWED_HOSTS`."""
    hosts = list(LOOPBACK)
    bind = environ.get("RLHF_BIND_HOST", "")
    if bind and bind not in ("0.0.0.0", "::"):
        hosts.append(bind)
    hosts += [h.strip() for h in environ.get("RLHF_ALLOWED_HOSTS", "").split(",") if h.strip()]
    return list(dict.fromkeys(hosts))


def create_app():
    """Prefect's server app wrapped in Starlette's `TrustedHostMiddleware` (lifespan events pass through)."""
    from prefect.server.api.server import create_app as prefect_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    return TrustedHostMiddleware(prefect_app(), allowed_hosts=allowed_hosts())
