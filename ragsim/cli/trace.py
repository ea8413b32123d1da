"""``ragsim trace ...``: create, convert, build and inspect traces."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ragsim.cli.common import (
    CORPUS_NAMES,
    QUESTION_NAMES,
    TRACE_NAMES,
    Command,
    Group,
    check_out_file,
    claim_output_dir,
    err,
    friendly_errors,
    out,
    phased_progress,
    print_json,
    require_extra,
)
from ragsim.errors import RagsimInputError

app = typer.Typer(cls=Group, no_args_is_help=True,
                  help="Create, convert and inspect traces.")


FORCE = typer.Option("--force", help="Replace an earlier trace or result in the folder.")
BUILD_FILES = ("requests.parquet", "documents.parquet", "build_report.json", "passages.parquet")


def _claim(destination: Path, inputs=(), force: bool = False, *, flag: str = "DESTINATION",
           writes=None) -> None:
    """A trace's folder: never one of its own inputs, never an earlier trace or a run's results
    without --force (a trace's requests.parquet and a run's share the name)."""
    from ragsim.outputs import RUN_FILES, TRACE_FILES

    claim_output_dir(destination, writes=writes or (*TRACE_FILES, *RUN_FILES[1:]),
                     inputs=inputs, force=force, flag=flag)


def _write(trace, destination: Path) -> None:
    """``write_trace``, a full disk said in one line."""
    from ragsim.traces import write_trace

    try:
        write_trace(trace, destination)
    except OSError as exc:
        raise RagsimInputError(f"the trace could not be written ({exc.strerror or exc}); "
                               "the folder holds none of its files", file=str(destination)
                               ) from None


@app.command("import-jsonl", cls=Command)
@friendly_errors
def trace_import_jsonl(source: Path, destination: Path,
                       force: Annotated[bool, FORCE] = False) -> None:
    """Convert the JSONL interchange format into a trace directory."""
    from ragsim.traces import read_jsonl

    _claim(destination, (source,), force)
    trace = read_jsonl(source)
    _write(trace, destination)
    _report_written(trace, destination)


@app.command("export-jsonl", cls=Command)
@friendly_errors
def trace_export_jsonl(trace: str, destination: Path,
                       seed: Annotated[int, typer.Option()] = 0,
                       requests: Annotated[int | None, typer.Option()] = None,
                       force: Annotated[bool, typer.Option(
                           "--force", help="Replace an existing file.")] = False) -> None:
    """Write a trace (a path or a built-in name) in the JSONL interchange format."""
    from ragsim.traces import resolve_trace, write_jsonl

    check_out_file(destination, "DESTINATION")
    if os.path.realpath(destination) in {os.path.realpath(p) for p in _files_of_trace(trace)}:
        raise RagsimInputError("is the trace being exported; give another file",
                               file=str(destination), field="DESTINATION")
    if destination.exists() and not force:
        raise RagsimInputError("exists; give another file, or --force to replace it",
                               file=str(destination), field="DESTINATION")
    data = resolve_trace(trace, seed=seed, n_requests=requests)
    try:
        write_jsonl(data, destination)
    except OSError as exc:
        raise RagsimInputError(f"could not be written ({exc.strerror or exc}); the file was "
                               "left as it was", file=str(destination)) from None
    err.print(f"wrote {data.n_requests:,} requests to {destination}")


@app.command("import-mooncake", cls=Command)
@friendly_errors
def trace_import_mooncake(source: Path, destination: Path,
                          force: Annotated[bool, FORCE] = False) -> None:
    """Convert a Mooncake trace (512-token hash blocks) into a trace directory."""
    from ragsim.traces import read_mooncake

    _claim(destination, (source,), force)
    trace = read_mooncake(source)
    _write(trace, destination)
    _report_written(trace, destination)


@app.command("import-ragpulse", cls=Command)
@friendly_errors
def trace_import_ragpulse(
    source: Annotated[Path, typer.Argument(help="RAGPulse's data folder (0_trace.jsonl and "
                                                "the five length files).")],
    destination: Annotated[Path, typer.Argument(help="Folder for the trace.")],
    clock: Annotated[str, typer.Option(
        help="weeks: the file's blocks that restart at 0 are consecutive weeks (the published "
             "file: two); sorted: one clock, requests sorted by timestamp.")] = "weeks",
    force: Annotated[bool, FORCE] = False,
) -> None:
    """Convert RAGPulse's published files into a trace: cached path = system-prompt segments
    then passages as listed; query = history, web search, user input and template."""
    from ragsim.traces.ragpulse import read_ragpulse

    if os.path.realpath(destination) == os.path.realpath(source):
        raise RagsimInputError("is RAGPulse's data folder, an input; give another folder",
                               file=str(destination), field="DESTINATION")
    _claim(destination, (source,), force)  # never over an earlier trace or result
    trace = read_ragpulse(source, clock=clock)
    _write(trace, destination)
    _report_written(trace, destination)


class GenerateCommand(Command):
    """``trace generate``: the generator settings' defaults are the built-in specs' own."""

    def help_defaults(self) -> dict[str, str]:
        from ragsim.traces import BUILTIN_SPECS

        def per_trace(field: str) -> str:
            values: dict[str, list[str]] = {}
            for name, spec in BUILTIN_SPECS.items():
                values.setdefault(f"{getattr(spec, field):g}", []).append(name)
            if len(values) == 1:
                return next(iter(values))
            return "; ".join(f"{', '.join(names)}: {v}" for v, names in values.items())

        return {"drift": per_trace("drift_per_1k_requests"),
                "co_retrieval": per_trace("co_retrieval_p")}


@app.command("generate", cls=GenerateCommand)
@friendly_errors
def trace_generate(name: str, destination: Path,
                   requests: Annotated[int | None, typer.Option()] = None,
                   seed: Annotated[int, typer.Option()] = 0,
                   drift: Annotated[float | None, typer.Option(
                       help="Fraction of popularity ranks that trade documents after every "
                            "1,000 requests (0: stationary).")] = None,
                   co_retrieval: Annotated[float | None, typer.Option(
                       help="Chance that a list's next document is a neighbour of the previous "
                            "one (fitted on real retrieval; 0: independent draws).")] = None,
                   force: Annotated[bool, FORCE] = False,
                   ) -> None:
    """Write a built-in synthetic trace (mmlu, nq) to a directory."""
    from ragsim.traces import BUILTIN_SPECS, builtin_trace

    if name not in BUILTIN_SPECS:
        raise RagsimInputError(f"unknown built-in trace {name!r}; known: "
                               f"{sorted(BUILTIN_SPECS)}")
    overrides = {}
    if drift is not None:
        if not 0.0 <= drift <= 1.0:
            raise RagsimInputError("must lie in [0, 1]", field="--drift")
        overrides["drift_per_1k_requests"] = drift
    if co_retrieval is not None:
        if not 0.0 <= co_retrieval <= 1.0:
            raise RagsimInputError("must lie in [0, 1]", field="--co-retrieval")
        overrides["co_retrieval_p"] = co_retrieval
    if requests is not None and requests <= 0:
        raise RagsimInputError(f"must be > 0, got {requests}", field="--requests")
    _claim(destination, (), force)
    trace = builtin_trace(name, seed=seed, n_requests=requests, **overrides)
    _write(trace, destination)
    _report_written(trace, destination)


@app.command("retime", cls=Command)
@friendly_errors
def trace_retime(trace: str, destination: Path,
                 rate: Annotated[float, typer.Option(help="Requests per second.")],
                 arrival: Annotated[str, typer.Option(help="poisson or gamma.")] = "poisson",
                 cv: Annotated[float, typer.Option(help="Coefficient of variation of the "
                                                        "gaps (gamma).")] = 1.0,
                 seed: Annotated[int, typer.Option()] = 0,
                 requests: Annotated[int | None, typer.Option()] = None,
                 force: Annotated[bool, FORCE] = False) -> None:
    """The same requests arriving at a new rate (Poisson or gamma gaps), written to a folder."""
    from ragsim.traces import resolve_trace
    from ragsim.traces.retime import retime

    _claim(destination, _files_of_trace(trace), force)
    data = retime(resolve_trace(trace, seed=seed, n_requests=requests), rate, process=arrival,
                  cv=cv, seed=seed)
    _write(data, destination)
    _report_written(data, destination)


@app.command("build", cls=Command)
@friendly_errors
def trace_build(
    corpus: Annotated[str, typer.Option(help="Passages: a .jsonl/.parquet file (id, text, "
                                             f"optional title) or {CORPUS_NAMES}.")],
    questions: Annotated[str, typer.Option(help="Questions: a .jsonl/.parquet file (text, "
                                                "optional answer, arrival_s) or "
                                                f"{QUESTION_NAMES}.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the trace and report.")],
    top_k: Annotated[int, typer.Option(help="Documents retrieved per request.")] = 2,
    index: Annotated[str, typer.Option(help="ivf or hnsw.")] = "ivf",
    stages: Annotated[int, typer.Option(help="Search stages recorded per request.")] = 4,
    nlist: Annotated[int | None, typer.Option(
        help="IVF lists (default 4*sqrt(documents), at most documents/39).")
                     ] = None,
    nprobe: Annotated[int | None, typer.Option(help="IVF lists probed (default nlist/16).")
                      ] = None,
    hnsw_m: Annotated[int, typer.Option(help="HNSW links per node.")] = 32,
    ef_construction: Annotated[int, typer.Option(help="HNSW build breadth.")] = 64,
    ef_search: Annotated[int, typer.Option(help="HNSW search breadth of the last stage.")
                         ] = 64,
    chunking: Annotated[str, typer.Option(help="passage, window or pack.")] = "passage",
    window_tokens: Annotated[int, typer.Option(help="Window / pack size in tokens.")] = 256,
    overlap_tokens: Annotated[int, typer.Option(help="Tokens shared by neighbouring "
                                                     "windows.")] = 32,
    tokenizer: Annotated[str, typer.Option(help="mistral, cl100k or a SentencePiece "
                                                ".model file.")] = "mistral",
    embedder: Annotated[str, typer.Option(help="minilm or a sentence-transformers model "
                                               "folder.")] = "minilm",
    cache_dir: Annotated[Path | None, typer.Option(help="Embedding cache (default: the user "
                                                        "cache folder).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Embed everything again, keep "
                                                               "nothing.")] = False,
    requests: Annotated[int | None, typer.Option(help="Requests (default: every question "
                                                      "once).")] = None,
    sampling: Annotated[str, typer.Option(help="once, uniform or zipf (with replacement).")
                        ] = "once",
    order: Annotated[str, typer.Option(help="file or shuffle (sampling once).")] = "file",
    zipf_s: Annotated[float, typer.Option(help="Popularity exponent (sampling zipf).")] = 1.0,
    arrival: Annotated[str, typer.Option(help="poisson, gamma, or file (the questions' "
                                              "arrival_s).")] = "poisson",
    rate: Annotated[float, typer.Option(help="Requests per second.")] = 1.0,
    cv: Annotated[float, typer.Option(help="Gap coefficient of variation (gamma).")] = 1.0,
    output_tokens: Annotated[str, typer.Option(help="'answer' (the answer's tokens) or a "
                                                    "number.")] = "answer",
    redact_text: Annotated[bool, typer.Option("--redact-text", help="Store no question or "
                                              "document text; hash answer keys.")] = False,
    paraphrase_p: Annotated[float, typer.Option(
        help="Answer-cache workload: share of requests asking a templated rewrite of their "
             "question (same answer key; embedded and searched as its own query).")] = 0.0,
    query_embeddings: Annotated[bool, typer.Option(
        "--query-embeddings", help="Store each request's query embedding (the answer "
                                   "cache's semantic tier then embeds nothing at run time).")
    ] = False,
    seed: Annotated[int, typer.Option()] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")
                           ] = False,
    force: Annotated[bool, FORCE] = False,
) -> None:
    """Build a trace from a corpus and questions: real tokenizer, embedder and staged faiss search.

    Writes requests.parquet and documents.parquet (the trace), build_report.json and
    passages.parquet (each document's corpus passages). Embeddings are cached, so rebuilding
    with other index or arrival options does not embed again.
    """
    require_extra("corpus", "ragsim trace build")
    # before the embedding and indexing: a typo, an input or an earlier result
    _claim(out_dir, (corpus, questions), force, flag="--out",
           writes=(*BUILD_FILES, "summary.json", "config.toml"))
    from ragsim.traces.corpus import (
        BuildOptions,
        Chunking,
        IndexSpec,
        build_trace,
        write_build,
    )
    from ragsim.traces.corpus.embedding import default_cache_dir

    options = BuildOptions(
        corpus=corpus, questions=questions, top_k=top_k,
        index=IndexSpec(kind=index, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m,
                        ef_construction=ef_construction, ef_search=ef_search, stages=stages),
        chunking=Chunking(mode=chunking, window_tokens=window_tokens,
                          overlap_tokens=overlap_tokens),
        tokenizer=tokenizer, embedder=embedder,
        cache_dir=None if no_cache else (cache_dir or default_cache_dir()),
        requests=requests, sampling=sampling, order=order, zipf_s=zipf_s, arrival=arrival,
        rate_rps=rate, cv=cv, output_tokens=output_tokens, redact_text=redact_text,
        paraphrase_p=paraphrase_p, query_embeddings=query_embeddings, seed=seed)
    options.validate()
    progress, report = phased_progress()

    with progress:
        result = build_trace(options, progress=report)
    try:
        write_build(result, out_dir)
    except OSError as exc:
        raise RagsimInputError(f"the trace could not be written ({exc.strerror or exc})",
                               file=str(out_dir), field="--out") from None
    _report_written(result.trace, out_dir)
    if json_output:
        print_json(result.report)
        return
    _print_build_report(result.report)


def _print_build_report(r: dict) -> None:
    s = r["staged_search"]
    rows = [
        ("corpus", f"{r['corpus']['source']}: {r['corpus']['passages']:,} passages -> "
                   f"{r['corpus']['documents']:,} documents ({r['corpus']['chunking']['mode']})"),
        ("document tokens", "p50 {p50:g}, mean {mean:g}, max {max:,}".format(
            **r["corpus"]["document_tokens"])),
        ("questions", f"{r['questions']['source']}: {r['questions']['requests']:,} requests, "
                      f"{r['questions']['distinct_asked']:,} distinct "
                      f"({r['questions']['sampling']})"),
        ("tokenizer", r["tokenizer"]),
        ("embedder", f"{r['embedder']['model']} ({r['embedder']['dimension']}-d; "
                     f"{r['embedder']['embedded']:,} embedded, {r['embedder']['from_cache']:,} "
                     "from cache)"),
        ("index", ", ".join(f"{k}={v}" for k, v in r["index"].items())),
        ("recall@k vs exact", f"{s['recall_at_k_vs_exact']:.3f} (identical top-k: "
                              f"{s['final_equals_exact']:.1%})"),
        ("stage = final top-k", ", ".join(f"{c:.0%}" for c in s["stage_equals_final"])),
        ("search time", f"mean {s['search_time_mean_s'] * 1e3:.3g} ms, p99 "
                        f"{s['search_time_p99_s'] * 1e3:.3g} ms ({s['measured_on']})"),
        ("retrieval skew", ", ".join(f"{k.removeprefix('top_').removesuffix('_share')}: "
                                     f"{v:.0%}" for k, v in r["retrieval_skew"].items())),
        ("documents retrieved", f"{r['unique_documents_retrieved']:,}"),
    ]
    table = Table(title="trace build", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)


def _report_written(trace, destination: Path) -> None:
    from ragsim.serving.notices import repeated as repeated_sentence
    from ragsim.serving.notices import repeated_documents

    err.print(f"wrote {trace.n_requests:,} requests and {trace.n_documents:,} documents to "
              f"{destination}")
    if trace.info.get("document_size_mismatches"):
        err.print(f"[yellow]warning:[/] {trace.info['document_size_mismatches']} document size "
                  f"mismatch(es), first sizes kept; {trace.info['first_size_mismatch']}")
    if trace.info.get("unchained_block_rows"):
        err.print(f"[yellow]warning:[/] {trace.info['unchained_block_rows']:,} request(s) whose "
                  "hash_ids are not chained by prefix, as Mooncake's are (each block is kept "
                  "under its own prefix, a node per prefix); "
                  f"{trace.info['first_unchained_block']}", highlight=False, soft_wrap=True)
    repeated = repeated_documents(trace.doc_offsets, trace.doc_ids)
    if repeated:
        err.print(f"[yellow]warning:[/] {repeated_sentence(repeated)}", highlight=False,
                  soft_wrap=True)


@app.command("stats", cls=Command)
@friendly_errors
def trace_stats_command(
    traces: Annotated[list[str], typer.Argument(
        metavar="TRACE",
        help=f"Built-in names ({TRACE_NAMES}), trace folders or JSONL files.")],
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object; with several "
                                              "traces, one per trace keyed by name.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write the retrieval-skew and document-size "
                                                   "figure (.png, .svg or .pdf).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of built-in traces (all of them).")] = 0,
    requests: Annotated[int | None, typer.Option(help="Use the first N requests of every "
                                                      "trace.")] = None,
) -> None:
    """Requests, documents, tokens, top-k, retrieval skew and popularity drift of traces.

    Drift (top10_turnover*): the share of the 10 most frequent leading documents that changes
    between consecutive windows of 1,000 requests, corrected with the same trace shuffled
    (about 0: stationary; 1: replaced every window).

    With --plot, also the paper's skew analysis: cumulative share of retrievals against the top
    fraction of documents (Figure 5) and the sizes of the retrieved documents (Figure 3), one
    line per trace.
    """
    from ragsim.figures import check_plot_path
    from ragsim.traces import resolve_trace, trace_stats
    from ragsim.traces.plots import plot_skew
    from ragsim.traces.skew import trace_skew

    if plot is not None:
        check_plot_path(plot)  # before reading traces: a typo should cost nothing
    if len(set(traces)) != len(traces):
        repeated = sorted({t for t in traces if traces.count(t) > 1})
        raise RagsimInputError(f"{', '.join(repeated)} given more than once", field="TRACE")
    loaded = {name: resolve_trace(name, seed=seed, n_requests=requests) for name in traces}
    if plot is not None:
        notes = plot_skew([trace_skew(t, name) for name, t in loaded.items()], plot)
        for note in notes:
            err.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
        err.print(f"wrote {plot}", highlight=False)
    stats = {name: trace_stats(t) for name, t in loaded.items()}
    if json_output:
        print_json(stats if len(stats) > 1 else stats[traces[0]])
        return

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    if len(stats) == 1:
        table = Table(title=f"trace {traces[0]}", show_header=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
    else:
        table = Table("", *traces, title="traces")
        table.columns[0].style = "bold"
        for column in table.columns[1:]:
            column.justify = "right"
    keys = list(dict.fromkeys(key for s in stats.values() for key in s))  # rows some lack
    for key in keys:
        if key != "info":
            table.add_row(key, *[cell(s[key]) if key in s else "-" for s in stats.values()])
    out.print(table)
    for name, s in stats.items():
        if s["info"]:
            label = "how it was made" if len(stats) == 1 else f"how {name} was made"
            out.print(f"[bold]{label}:[/]", json.dumps(s["info"], indent=1, default=str),
                      highlight=False)


def _files_of_trace(trace: str) -> tuple[str, ...]:
    """The files a trace argument reads (none for a built-in name)."""
    path = Path(trace)
    if not path.exists():
        return ()
    return (str(path.parent),) if path.is_file() and path.suffix != ".jsonl" else (trace,)
