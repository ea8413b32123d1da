"""What ragsim starts ends with it: a SIGKILLed run leaves no answer-cache server listening and,
by its next start, no temporary folder of its own."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

STARTS_A_SERVER = """
import sys, time
from ragsim.realrun.answers.server import EmbeddedServer
server = EmbeddedServer().start()
print(server.port, server._dir, server.process.pid, flush=True)
time.sleep(600)
"""


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_a_sigkilled_run_takes_its_server_and_leaves_its_folder_to_the_next():
    run = subprocess.Popen([sys.executable, "-c", STARTS_A_SERVER], stdout=subprocess.PIPE,
                           text=True)
    port_text, folder, server_pid = run.stdout.readline().split()
    port = int(port_text)
    assert _listening(port) and Path(folder).is_dir()
    run.kill()  # no exit handler runs
    run.wait()
    deadline = time.monotonic() + 20
    while (_listening(port) or _alive(int(server_pid))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listening(port) and not _alive(int(server_pid))
    from ragsim.children import own_temp_dir

    mine = own_temp_dir("answers")  # the next start clears what the killed run could not
    try:
        assert not Path(folder).exists()
    finally:
        Path(mine).rmdir()
