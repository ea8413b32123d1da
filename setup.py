"""Build: compile the policy core's hot modules and the simulator's per-request code with Cython.

``ragsim/cache/tree.py``, the policies and the cost grids are written in Cython's "pure Python
mode": valid Python with C type annotations, compiled without bounds or negative-index checks
(their typed indices never need them). The simulator's plain-Python modules (the engine and the
pipeline, SimPy processes included, and their per-request decisions) are compiled as they are,
with Python's indexing rules kept: ``xs[-1]`` on a list must stay the last item. Where such a
module has a ``.pxd`` beside it (the engine, the pipeline), its classes compile to extension
types whose fields are struct members (each a Python object, public): the source stays plain
Python. Compiled, a run is faster; the behaviour is the same source either way (tests check
that the compiled modules are the ones in use, and that a run is bit for bit the same).
"""

from Cython.Build import cythonize
from setuptools import setup

# pure Python mode with C types: no index checks
TYPED = [
    "ragsim/cache/tree.py",
    "ragsim/cache/policies/base.py",
    "ragsim/cache/policies/lru.py",
    "ragsim/cache/policies/lfu.py",
    "ragsim/cache/policies/gdsf.py",
    "ragsim/cache/policies/pgdsf.py",
    "ragsim/cache/policies/fifo.py",
    "ragsim/cache/policies/belady.py",
    "ragsim/profiles/grid.py",
]
# plain Python, compiled as it is, with Python's semantics
AS_WRITTEN = [
    # the simulator's per-request decisions
    "ragsim/cache/reorder.py",
    "ragsim/cache/speculation.py",
    "ragsim/cache/reuse.py",
    "ragsim/serving/retrieval.py",
    # the serving stack's processes and the simulated clock
    "ragsim/serving/engine.py",
    "ragsim/serving/pipeline.py",
    "ragsim/serving/clock.py",
    "ragsim/serving/costs.py",
    "ragsim/sim/simulator.py",
    "ragsim/sim/predicted.py",
]
COMPILED = TYPED + AS_WRITTEN

setup(
    ext_modules=cythonize(
        TYPED,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "initializedcheck": False,
            "embedsignature": True,
        },
    )
    + cythonize(
        AS_WRITTEN,
        language_level=3,
        # annotations are hints here, not C types: a `list[float]` parameter still takes a tuple
        compiler_directives={"embedsignature": True, "annotation_typing": False},
    ),
)
