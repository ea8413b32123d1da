"""The process's page faults, counted around a part of a real run: what a run that paid its
memory's pages inside its clock shows, where its times alone do not say why.

Why: on a CPU a run's allocator can hand its heap back to the system between runs (tcmalloc
releases free pages at a rate), and the next run then writes fresh pages inside its clock. In
run BB two of sixty torch runs did (their heap grown before the clock in 1.2-1.3 s against
0.11-0.18 s, their batch rebuilds up to 5.3 s against 0.2-0.5 s), and each moved its point's
mean error by about 20 points; five runs in one process counted 595k, 441k, 45k, 3.5k and 2.8k
minor faults (docs/validation.md, "Run BB"). The counts are ``getrusage``'s for the whole
process (every thread: the engine's, the searches', a fleet's other replicas), minor (a page
mapped from memory, as a first touch is) and major (read from disk)."""

from __future__ import annotations

import resource
from dataclasses import dataclass


@dataclass(frozen=True)
class PageFaults:
    """The process's page faults since it started (``getrusage(RUSAGE_SELF)``)."""

    minor: int
    major: int

    @classmethod
    def now(cls) -> PageFaults:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(int(usage.ru_minflt), int(usage.ru_majflt))

    def since(self, earlier: PageFaults) -> PageFaults:
        """The faults between ``earlier`` and this count."""
        return PageFaults(self.minor - earlier.minor, self.major - earlier.major)
