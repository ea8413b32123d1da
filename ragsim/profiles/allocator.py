"""Which memory allocator this process runs on, and what that does to a CPU engine's timings.

PyTorch's and vLLM's CPU guides both tell users to preload tcmalloc (vLLM warns at start when
it is not), and on this project's 2-core machine the difference is not small
(``benchmarks/new_shapes.py``, one process, one engine, 2026-12-03):

* vLLM on glibc's malloc: a prefill of a token count it had not run took 1.3-2.1x the time of
  the same prefill again, and 1.5x again after 200 other sizes; a batch of 54 prompts of 300
  tokens took 1,398, 1,184 and 564 ms, three times in a row. With tcmalloc: 1.24x the first
  time, none after other sizes, and 522, 230, 231 ms.
* The torch engine on glibc: 1.12x the first time, the batch 1.14x; with tcmalloc 1.01x and
  every pass ~20-30% faster.

A profile times each shape after a warm-up of the same shape; a run's prompts have every
length, so on glibc's malloc most of its steps pay the first-time price the profile never
sees (vLLM's idle prefills were predicted 25-45% short, its first full batches at overload
ran 1.6 s where 0.4 s was priced). A profile and a run must also share an allocator, or the
profile prices another engine. So profiles record the allocator they were measured on
(``obtained.allocator``), real runs record theirs (``allocator`` in the summary), and
``validate`` says when either is glibc's or when they differ.

LD_PRELOAD must be set before the process starts: ``LD_PRELOAD=libtcmalloc_minimal.so.4``
(Debian and Ubuntu: the ``libtcmalloc-minimal4`` package).
"""

from __future__ import annotations

from pathlib import Path

# allocators a process maps as a library of their own, in the order they are looked for
PRELOADED = ("tcmalloc", "jemalloc", "mimalloc")
TCMALLOC_PRELOAD = "LD_PRELOAD=libtcmalloc_minimal.so.4"


def memory_allocator(maps: Path = Path("/proc/self/maps")) -> str:
    """``tcmalloc``, ``jemalloc`` or ``mimalloc`` when the process maps one, ``glibc`` when
    it maps only glibc's C library, ``unknown`` where the memory map cannot be read (not
    Linux)."""
    try:
        text = maps.read_text()
    except OSError:
        return "unknown"
    for name in PRELOADED:
        if f"lib{name}" in text:
            return name
    return "glibc" if "libc.so" in text or "libc-" in text else "unknown"


def allocator_note(engine: str, profile_allocator: str | None, run_allocator: str
                   ) -> str | None:
    """A warning for a validation whose engine runs on glibc's malloc, or whose profile was
    measured on another allocator than the run's (None: nothing to say). A profile measured
    before allocators were recorded says nothing about its own."""
    if run_allocator == "glibc":
        return (f"the {engine} engine runs on glibc's malloc: steps of a size it has not run "
                "take up to 2x their repeated time, which the profile's timings leave out "
                f"(docs/validation.md); start it with {TCMALLOC_PRELOAD}, as the engines' CPU "
                "guides say")
    if profile_allocator is not None and profile_allocator not in (run_allocator, "unknown") \
            and run_allocator != "unknown":
        return (f"the profile was measured on {profile_allocator} and the {engine} engine "
                f"runs on {run_allocator}: it prices another engine's steps")
    return None
