"""`sweep --executor ray` on a local cluster: every socket its processes listen on is loopback,
and the cluster runs with Ray's token authentication, whose token is written nowhere.

The sweep runs as a user starts it (its own process, a fresh import of ray); the test reads
the kernel's own tables (``/proc/net/tcp``, ``/proc/net/tcp6`` and each process's open
sockets) while the sweep runs, over the sweep's whole process tree (driver, GCS, raylet,
workers, agents)."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed"),
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc"),
    pytest.mark.slow,  # starts a Ray cluster (~20 s; CI runs it: pytest -m slow)
]

LISTEN = "0A"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in the host's (little-endian)
    byte order."""
    words = [bytes.fromhex(hex_address[i:i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    return ipaddress.ip_address(b"".join(words))


def test_address_decoding_by_hand():
    assert str(_address("0100007F")) == "127.0.0.1"
    assert str(_address("00000000")) == "0.0.0.0"
    assert str(_address("00000000000000000000000001000000")) == "::1"
    mapped = _address("0000000000000000FFFF00000100007F")  # ::ffff:127.0.0.1
    assert mapped.ipv4_mapped == ipaddress.IPv4Address("127.0.0.1") and loopback(mapped)
    assert not loopback(_address("0000000000000000FFFF00000200000A"))  # ::ffff:10.0.0.2
    assert not loopback(_address("00000000")) and loopback(_address("0100007F"))


def loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, an IPv4-mapped IPv6 address included (Python < 3.13 says it is not)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def listening_sockets() -> dict[int, str]:
    """Socket inode -> "address:port" of every TCP socket listening in this network
    namespace."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            found[int(fields[9])] = f"{_address(address)}:{int(port, 16)}"
    return found


def process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        pid, ppid = int(stat.parent.name), int(text.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def sockets_of(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # gone meanwhile
        pass
    return inodes


def command_of(pid: int) -> str:
    """The program's own name and its first arguments, short enough to print: the name comes
    first and whole, since the directory above it (a virtual environment's, say) can be
    longer than any fixed cut."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    return " ".join([Path(argv[0]).name, *argv[1:]])[:80]


def environment_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


def test_a_local_ray_sweep_listens_on_loopback_only_with_authentication(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text("""
seeds = [0, 1, 2]
[base]
trace = "mmlu"
n_requests = 20000
rate_rps = 2.0
[axes]
policy = ["pgdsf", "lru"]
""")
    home = tmp_path / "home"  # where Ray would write a token file (~/.ray/auth_token)
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(home)
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "ragsim", "sweep", str(spec), "--out",
                                str(out), "--executor", "ray", "--jobs", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    seen: dict[str, str] = {}  # "address:port" -> the process listening on it
    auth_modes: dict[str, str | None] = {}
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        listening = listening_sockets()
        for pid in process_tree(process.pid):
            mine = sockets_of(pid) & listening.keys()
            command = command_of(pid)
            for inode in mine:
                seen[listening[inode]] = command
            if "gcs_server" in command or "raylet" in command:
                auth_modes[command.split()[0]] = environment_of(pid).get("RAY_AUTH_MODE")
        time.sleep(0.2)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert any("gcs_server" in c for c in seen.values()), seen  # the cluster was seen up
    assert any("raylet" in c for c in seen.values()), seen
    open_ = {a: c for a, c in seen.items()
             if not loopback(ipaddress.ip_address(a.rpartition(":")[0]))}
    assert not open_, open_
    assert auth_modes and set(auth_modes.values()) == {"token"}, auth_modes
    assert not (home / ".ray").exists()  # the token was given, not written
    assert "RAY_AUTH_TOKEN" not in stdout + stderr

