"""Which allocator a process runs on (``ragsim.profiles.allocator``): read from its memory map,
told apart on hand-written maps and on real processes started with and without tcmalloc."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest

from ragsim.profiles.allocator import TCMALLOC_PRELOAD, allocator_note, memory_allocator

LIBC = "7f3a1c000000-7f3a1c028000 r--p 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
TCMALLOC = ("7f3a1b000000-7f3a1b020000 r-xp 00000000 08:01 99 "
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n")


@pytest.mark.parametrize("maps, expected", [
    (LIBC, "glibc"),
    (TCMALLOC + LIBC, "tcmalloc"),  # tcmalloc replaces malloc; glibc is mapped all the same
    (LIBC + "7f00-7f10 r-xp 0 08:01 7 /opt/lib/libjemalloc.so.2\n", "jemalloc"),
    ("55d0-55e0 r-xp 0 08:01 1 /bin/true\n", "unknown"),  # a static binary: no C library
])
def test_the_allocator_is_read_from_the_memory_map(tmp_path, maps, expected):
    path = tmp_path / "maps"
    path.write_text(maps)
    assert memory_allocator(path) == expected


def test_no_memory_map_is_unknown(tmp_path):
    assert memory_allocator(tmp_path / "absent") == "unknown"


def _allocator_of_a_process(env: dict) -> str:
    code = "from ragsim.profiles.allocator import memory_allocator; print(memory_allocator())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
def test_a_real_process_with_and_without_tcmalloc():
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    assert _allocator_of_a_process(plain) == "glibc"
    if ctypes.util.find_library("tcmalloc_minimal") is None:
        pytest.skip("libtcmalloc_minimal is not installed (Debian: libtcmalloc-minimal4)")
    preload = TCMALLOC_PRELOAD.split("=", 1)[1]
    assert _allocator_of_a_process({**plain, "LD_PRELOAD": preload}) == "tcmalloc"


def test_a_validation_hears_about_glibc_and_about_a_profile_of_another_allocator():
    on_glibc = allocator_note("vllm", "glibc", "glibc")
    assert on_glibc is not None and TCMALLOC_PRELOAD in on_glibc
    mixed = allocator_note("torch", "glibc", "tcmalloc")
    assert mixed is not None and "measured on glibc" in mixed and "runs on tcmalloc" in mixed
    assert allocator_note("torch", "tcmalloc", "tcmalloc") is None
    assert allocator_note("torch", None, "tcmalloc") is None  # a profile from before: silent
    assert allocator_note("torch", "tcmalloc", "unknown") is None
