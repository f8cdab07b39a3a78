"""A TCP forwarder between network namespaces: the multi-host drill's stand-in for a service on another host.

Usage: python netns_forward.py LISTEN TARGET
  LISTEN and TARGET are NAMESPACE/ADDRESS:PORT; NAMESPACE is a name under /var/run/netns (`ip netns add`), or
  `-` for the namespace this process started in. Example: gp-db/10.77.0.2:5432 -/127.0.0.1:5432 makes the
  machine's PostgreSQL answer at 10.77.0.2:5432 on the drill's LAN, as if it ran on a host of its own.

A socket belongs to the network namespace its creating thread was in when it was made: this process enters the
listening namespace, binds, and returns; each accepted connection is then joined to a socket made the same way
in the target namespace. Prints `ready` once it listens. Ends on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import sys
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_HOME = os.open("/proc/self/ns/net", os.O_RDONLY)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


@contextlib.contextmanager
def netns(name: str) -> Iterator[None]:
    """Inside `name` (`-`: stay where we are) until the block ends; only this thread moves."""
    if name == "-":
        yield
        return
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(fd)
        yield
    finally:
        _setns(_HOME)
        os.close(fd)


def endpoint(text: str) -> tuple[str, str, int]:
    namespace, _, address = text.partition("/")
    host, _, port = address.rpartition(":")
    return namespace, host, int(port)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        # A reset on one side is passed on as a reset, so the far end does not wait on a dead connection.
        writer.transport.abort()
        return
    # An orderly end is passed on as a half-close: a client that closed its side may still read the answer.
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()


async def forward(target: tuple[str, str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    namespace, host, port = target
    with netns(namespace):
        outgoing = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    outgoing.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(outgoing, (host, port))
        far_reader, far_writer = await asyncio.open_connection(sock=outgoing)
    except OSError:
        outgoing.close()
        writer.close()
        return
    for side in (writer, far_writer):
        sock = side.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(pipe(reader, far_writer), pipe(far_reader, writer))
    for side in (writer, far_writer):
        side.close()


async def main(listen: str, target: str) -> None:
    namespace, host, port = endpoint(listen)
    with netns(namespace):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(1024)
    listener.setblocking(False)
    connections: set[asyncio.Task[None]] = set()

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Held here until done: asyncio keeps only weak references to tasks, and a connection that stalls (its
        # host cut off) must wait as long as the kernel keeps it, not be collected.
        task = asyncio.create_task(forward(endpoint(target), reader, writer))
        connections.add(task)
        task.add_done_callback(connections.discard)

    await asyncio.start_server(accepted, sock=listener)
    print("ready", flush=True)
    # SIGTERM's default action ends the process; the kernel closes every connection it held.
    await asyncio.Event().wait()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
