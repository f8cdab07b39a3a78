"""Hosts on one machine for the multi-host drill: each a network namespace, wired to Linux bridges by veth pairs.

Two networks, as a site separates them: the portal's LAN (PostgreSQL and Redis, the proxy, the web servers,
the workers, beat) and the clusters' network, which only the worker hosts join (README, "Where the cluster
keys live": the web tier never reaches slurmrestd). The bridges live in a namespace of their own (`gp-switch`),
so the machine's own interfaces and routes are never touched and removing the namespaces removes everything.

Services that run on this machine itself (PostgreSQL, Redis, the clusters' slurmrestd, all on 127.0.0.1) are
given an address on these networks by `netns_forward.py`: a forwarder that listens in a host's namespace and
connects to the machine's loopback, the stand-in for the service running on that host. The drill's clients
reach the proxy the same way, from the machine's loopback. Cutting a host off is setting its switch ports down:
its connections stall as they would when its cable is pulled, and resume when the ports come back up.

Needs root and Debian's iproute2 (`bash scripts/services.sh iproute2`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

PREFIX = "gp-"
SWITCH = f"{PREFIX}switch"
LAN_BRIDGE, CLUSTER_BRIDGE = "lan", "clusters"
LAN_PREFIX, CLUSTER_PREFIX = "10.77.0", "10.77.1"
FORWARDER = Path(__file__).resolve().parent / "netns_forward.py"
# Forwarders run in the machine's own namespace: their ids are kept here so a crashed run's are stopped.
PID_FILE = Path("/run/gpuportal-drill-hosts.pids")
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


@dataclass(frozen=True)
class Host:
    """One host: its namespace and its address on each network it joins (`None`: not on that network)."""

    name: str
    lan: str | None = None
    clusters: str | None = None

    @property
    def namespace(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def ports(self) -> list[str]:
        """Its ports on the switch (the veth ends in `gp-switch`)."""
        return [f"{self.name}-{suffix}" for suffix, address in (("l", self.lan), ("c", self.clusters)) if address]

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run on this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *arguments], check=check, capture_output=True, text=True)  # noqa: S603, S607


def namespaces_stale() -> list[str]:
    listed = _ip("netns", "list").stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(PREFIX)]


def remove_stale() -> list[str]:
    """Remove what an earlier run left (its processes, namespaces and forwarders); what it removed."""
    removed = []
    for namespace in namespaces_stale():
        for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "delete", namespace, check=False)
        removed.append(namespace)
    if PID_FILE.exists():
        for pid in PID_FILE.read_text().split():
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                if "netns_forward" in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(int(pid), signal.SIGKILL)
                    removed.append(f"forwarder {pid}")
        PID_FILE.unlink()
    return removed


class Network:
    """The hosts and the two bridges joining them; `create()`, then `cut(host)`/`restore(host)`, `remove()`."""

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = {host.name: host for host in hosts}
        self._forwarders: list[subprocess.Popen[str]] = []

    def create(self) -> None:
        _ip("netns", "add", SWITCH)
        for bridge in (LAN_BRIDGE, CLUSTER_BRIDGE):
            _ip("-n", SWITCH, "link", "add", bridge, "type", "bridge")
            _ip("-n", SWITCH, "link", "set", bridge, "up")
        for host in self.hosts.values():
            _ip("netns", "add", host.namespace)
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            for port, (bridge, inside, address) in zip(host.ports, self._links(host), strict=True):
                _ip("-n", SWITCH, "link", "add", port, "type", "veth", "peer", "name", inside, "netns", host.namespace)
                _ip("-n", SWITCH, "link", "set", port, "master", bridge, "up")
                _ip("-n", host.namespace, "addr", "add", f"{address}/24", "dev", inside)
                _ip("-n", host.namespace, "link", "set", inside, "up")

    @staticmethod
    def _links(host: Host) -> list[tuple[str, str, str]]:
        links = []
        if host.lan:
            links.append((LAN_BRIDGE, "lan0", host.lan))
        if host.clusters:
            links.append((CLUSTER_BRIDGE, "clusters0", host.clusters))
        return links

    def cut(self, name: str) -> None:
        """Pull the host's cables: its switch ports go down, its connections stall."""
        for port in self.hosts[name].ports:
            _ip("-n", SWITCH, "link", "set", port, "down")

    def restore(self, name: str) -> None:
        for port in self.hosts[name].ports:
            _ip("-n", SWITCH, "link", "set", port, "up")

    def forward(self, listen: str, target: str, *, log: Path) -> None:
        """Start a forwarder (`netns_forward.py LISTEN TARGET`, its errors in `log`) and wait until it listens."""
        with log.open("ab") as errors:
            process = subprocess.Popen(  # noqa: S603 -- our own script
                [sys.executable, str(FORWARDER), listen, target],
                stdout=subprocess.PIPE,
                stderr=errors,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        self._forwarders.append(process)
        with PID_FILE.open("a") as pids:
            pids.write(f"{process.pid}\n")
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the forwarder {listen} -> {target} did not start")

    def remove(self) -> None:
        """Stop the forwarders, end whatever still runs on the hosts, delete every namespace (and with them the
        bridges and veth pairs)."""
        for process in self._forwarders:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for process in self._forwarders:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
        self._forwarders.clear()
        remove_stale()


_libc = ctypes.CDLL(None, use_errno=True)


def run_on(namespace: str, function: Callable[[], T]) -> T:
    """Call `function` in a thread of its own that has entered `namespace` (only that thread moves; the sockets
    it makes stay in that namespace)."""
    outcome: dict[str, object] = {}

    def body() -> None:
        fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            outcome["value"] = function()
        except BaseException as exc:  # handed back to the caller
            outcome["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=body, name=f"on-{namespace}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def connect_outcome(namespace: str, address: str, port: int, *, timeout_seconds: float = 3) -> str:
    """What a TCP connection from `namespace` to `address:port` meets: `connected`, or the error."""

    def attempt() -> str:
        try:
            with socket.create_connection((address, port), timeout=timeout_seconds):
                return "connected"
        except OSError as exc:
            return exc.strerror or type(exc).__name__

    return run_on(namespace, attempt)


@contextlib.contextmanager
def network(hosts: list[Host]) -> Iterator[Network]:
    """A fresh network (an earlier run's leftovers removed first), removed afterwards whatever happened."""
    remove_stale()
    net = Network(hosts)
    try:
        net.create()
        yield net
    finally:
        net.remove()
