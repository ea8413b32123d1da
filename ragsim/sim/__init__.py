"""The simulator's drivers: the serving pipeline on a virtual clock with predicted costs
(``simulator.py``), and the flat trace replay (``replay.py``)."""
