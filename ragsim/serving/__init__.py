"""The serving stack as SimPy processes over the policy core, neutral about time and cost.

Arrivals, staged vector search, the request pool, the engine's continuous batching over the
knowledge tree, faults, per-request records and the run summary live here once. A driver gives
the pipeline a clock and the engine's ``Iterations``: the simulator (``ragsim.sim``) a virtual
clock and the cost profile's predictions, the real harness (``ragsim.realrun``) a wall clock and
a real model. Imports: ``sim``/``realrun`` -> ``serving`` -> ``cache``, ``profiles``, ``traces``.
"""
