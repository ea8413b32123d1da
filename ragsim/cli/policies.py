"""``ragsim policies``: the replacement policies and PGDSF's ablations, and what each has."""

from __future__ import annotations

from typing import Annotated

import typer

from ragsim.cli.common import name_table, out, print_json


def policies(json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the replacement policies (`--policy NAME`) and ablations: what each keeps, which
    parts of RAGCache's Algorithm 1 it has, whether the frequency scope matters to it."""
    from ragsim.cache.policies import describe_policies
    from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, FREQUENCY_SCOPES

    rows = describe_policies()
    if json_output:
        print_json({"policies": rows, "frequency_scopes": list(FREQUENCY_SCOPES),
                    "default_frequency_scope": DEFAULT_FREQUENCY_SCOPE})
        return
    table = name_table("policy", [r["name"] for r in rows], "family", "keeps",
                       "Algorithm 1", "counts", title="policies (`--policy NAME`)")
    table.columns[0].style = "bold"
    for r in rows:
        counts = "--frequency-scope" if r["uses_frequency_scope"] else "-"
        notes = [r["algorithm1"]]
        if r["needs_profile"]:
            notes.append("needs a profile")
        if r["needs_future"]:
            notes.append("replay only")
        table.add_row(r["name"], r["family"], r["keeps"], "; ".join(notes), counts)
    out.print(table)
    out.print(f"frequency scopes: {', '.join(FREQUENCY_SCOPES)} (default "
              f"{DEFAULT_FREQUENCY_SCOPE}, the same for every policy)")
