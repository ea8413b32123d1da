"""Build: compile the policy core's hot modules with Cython (they are plain Python too).

``ragsim/cache/tree.py`` and the flat caches are written in Cython's "pure Python mode": valid
Python with C type annotations. Compiled, a replay runs several times faster; the behaviour is
the same source either way (tests check that the compiled modules are the ones in use).
"""

from Cython.Build import cythonize
from setuptools import setup

COMPILED = [
    "ragsim/cache/tree.py",
    "ragsim/cache/policies/base.py",
    "ragsim/cache/policies/lru.py",
    "ragsim/cache/policies/lfu.py",
    "ragsim/cache/policies/gdsf.py",
    "ragsim/cache/policies/pgdsf.py",
    "ragsim/cache/policies/fifo.py",
    "ragsim/cache/policies/belady.py",
    "ragsim/profiles/grid.py",
    # the simulator's per-request decisions: plain Python, compiled as they are
    "ragsim/cache/reorder.py",
    "ragsim/cache/speculation.py",
    "ragsim/cache/reuse.py",
    "ragsim/serving/retrieval.py",
]

setup(
    ext_modules=cythonize(
        COMPILED,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "initializedcheck": False,
            "embedsignature": True,
        },
    ),
)
