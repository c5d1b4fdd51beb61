"""Loopback ports for the servers the tests start, picked below the kernel's ephemeral
range: a port the kernel hands a probe (bind to port 0) comes from the range it hands the
next outgoing connections, so a server started a moment later could find it taken (a CI
run: the operator's metrics port, "Address already in use")."""

import random
import socket
from pathlib import Path

LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port nothing listens on now, outside the ephemeral range where it can."""
    highest = _ephemeral_start()
    for _ in range(100 if highest - LOWEST >= 1000 else 0):
        port = random.randrange(LOWEST, highest)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
