"""Studies: many runs as one table, and what is drawn, reported and planned from it.

``spec`` reads a sweep file into points, ``point`` runs one point exactly as ``ragsim run`` or
``ragsim replay`` would, ``executors`` spread points over local processes or a Ray cluster,
``sweep`` keeps the results table (incremental, resumable), ``plot``/``report``/``plan`` read it.
This package sees the command line's run and replay on purpose: a sweep point must be the same
run a user would start by hand, so it calls them rather than a second copy of their set-up.
"""
