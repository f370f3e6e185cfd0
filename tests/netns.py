"""Extra hosts for tests: Linux network namespaces joined to this machine by a bridge.

Each host is a namespace with its own loopback and one veth interface on a private
/24 of the 10.213.0.0/16 range, chosen from this process's pid so that two test
processes do not collide; the bridge (in this machine's namespace) holds the .1 address,
where the Spark master and the drivers listen. Processes started in a host see only its
network: they reach the others through the bridge, as machines on a LAN would. Files
and pids are shared (namespaces of the network only), which the test uses for the
shared checkpoint root, and nothing else.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class NetnsUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class ExtraHost:
    name: str  # the namespace
    address: str


@dataclass(frozen=True)
class HostNetwork:
    bridge: str
    gateway: str  # this machine's address on the bridge
    hosts: tuple[ExtraHost, ...]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")


def available() -> str | None:
    """Why extra hosts cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (Debian package iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    return None


@contextmanager
def extra_hosts(n_hosts: int = 2) -> Iterator[HostNetwork]:
    reason = available()
    if reason:
        raise NetnsUnavailable(reason)
    tag = f"sw{os.getpid() % 100000}"
    subnet = f"10.213.{os.getpid() % 250 + 1}"
    bridge = f"{tag}br"
    net = HostNetwork(bridge, f"{subnet}.1",
                      tuple(ExtraHost(f"{tag}h{i}", f"{subnet}.{11 + i}")
                            for i in range(n_hosts)))
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{net.gateway}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, host in enumerate(net.hosts):
            outside, inside = f"{tag}v{i}", f"{tag}e{i}"
            _ip("netns", "add", host.name)
            _ip("-n", host.name, "link", "set", "lo", "up")
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", host.name)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip("-n", host.name, "link", "set", inside, "up")
        yield net
    finally:
        for host in net.hosts:  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
