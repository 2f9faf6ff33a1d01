"""`python -m stages.bound_launch ARGS...`: `accelerate launch ARGS...` whose stores listen on one address only.

torchrun's agent hosts the launch's c10d `TCPStore` (static rendezvous), and c10d binds its server to every
interface whatever host it is given, with no authentication: any machine that can reach the port could write keys
into a running launch. Here the agent's store is handed a socket already listening on the main process address
(`--main_process_ip`: 127.0.0.1 on one machine, `resources.rdzv_endpoint`'s host on several), through `TCPStore`'s
public `master_listen_fd`. Reaches into `torch.distributed.elastic.rendezvous.static_tcp_rendezvous.TCPStore` (the
name that module calls); tests/stages/test_loopback.py pins that a one-machine launch listens on loopback only.
"""

from __future__ import annotations

import socket

def store_on(make_store, host: str, port: int):
    """`make_store(fd)`: a c10d `TCPStore` server built on a socket listening on `host:port` only (IPv6 when `host`
    has a colon). The store owns the descriptor from then on and closes it when it goes (so the Python socket lets
    go of it); if building the store fails, the socket is closed here."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=1024)
    try:
        store = make_store(sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()
    return store


def bind_agent_store() -> None:
    """Make torchrun's static rendezvous create its store on a socket bound to the given host only."""
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static

    plain = static.TCPStore
    if getattr(plain, "__bound__", False):
        return

    def bound(host_name, port, world_size=None, is_master=False, *args, **kwargs):
        if is_master and "master_listen_fd" not in kwargs:
            return store_on(lambda fd: plain(host_name, port, world_size, is_master, *args, master_listen_fd=fd,
                                             **kwargs), host_name, port)
        return plain(host_name, port, world_size, is_master, *args, **kwargs)

    bound.__bound__ = True  # type: ignore[attr-defined]
    static.TCPStore = bound


def main() -> None:
    from accelerate.commands.launch import main as accelerate_launch

    bind_agent_store()
    accelerate_launch()


if __name__ == "__main__":
    main()
