"""RAGPulse (flashserve/RAGPulse, MIT; arXiv 2511.12979): a university Q&A RAG service's
requests, imported as a trace.

The published folder holds ``0_trace.jsonl`` (one request a line) and five tables of token
lengths, one per kind of input segment: ``1_sys_prompt.jsonl`` (``sys_prompt_id``),
``2_passages.jsonl`` (``passage_id``: the knowledge base's passages), ``3_history.jsonl``,
``4_user_input.jsonl`` and ``5_web_search.jsonl`` (``history_id``, ...), each line
``{"<kind>_id": N, "token_length": L}``. A request line::

    {"timestamp": "27", "input_length": 3861, "output_length": 127,
     "hash_ids": {"sys_prompt": [8325, 8326, 11575], "passages_ids": [6123, 7239, ...],
                  "history": [15215], "web_search": [20319, 20320], "user_input": [23648]},
     "session_id": "1758081660427-xa8rbsd2uco1"}

What a request becomes:

* **cached path** (``doc_ids``): its system-prompt segments, then its passages, in the order the
  trace lists them (the order the service sent them to its model; its replay script joins the
  segments in the order of ``hash_ids``). A segment listed twice is two positions of the path,
  as the model read it twice: the knowledge tree caches ``[A, B, A]`` as three nodes, and the
  replay counts each occurrence's tokens.
* **one document id space**: a passage keeps its id; a system-prompt segment ``s`` becomes
  document ``SYSTEM_PROMPT_DOC_ID_BASE + s`` (10**12 + s), so the two id spaces cannot collide
  whatever ids a release uses (both must lie in [0, 10**12)). The published ids happen not to
  overlap; the offset does not rely on it. The documents table holds every passage and every
  system-prompt segment of the two length files.
* **query** (``query_tokens``): history + web search + user input + the template's own tokens,
  i.e. ``input_length`` minus the path's tokens (the remainder after every listed segment is 6-12
  tokens in the published trace). Never cached: history and web results differ per request.
* ``output_tokens``: ``output_length``; ``session_id``: kept as a column.
* **arrival** (``arrival_s``): ``timestamp`` (seconds, a string of digits in the published
  file). How the file's clock is read is ``clock``:

  - ``"weeks"`` (the default): the file is a run of week-long blocks, each sorted and each
    starting its clock at 0 again; block *b* is placed ``b * 604,800`` s later. The published
    file is two such blocks (3,800 and 3,306 requests): its session ids begin with their
    creation time in Unix milliseconds, which puts the first block's clock origin at
    2025-09-10 04:00:35 UTC and the second's at 2025-09-17 04:00:36 UTC (the README's 12:00:00,
    China time, a week apart). Read on one clock, 3,303 of the 7,090 requests whose session id
    carries a time would come before their session was created; on this clock, 14 (within
    seconds). A timestamp of a week or more inside a block is refused: it is not this layout.
  - ``"sorted"``: every timestamp on one clock, requests sorted by it (stable: ties keep the
    file's order). This overlays the two weeks onto one.

  Blank lines are skipped, in every file.

Errors (a line that is not JSON, a missing or mistyped field, an id with no length, lengths that
do not add up) name the file, the line and the field, before anything is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ragsim.errors import TraceError
from ragsim.traces.io import _COMPRESSED_OPENERS, _short, iter_json_objects
from ragsim.traces.schema import Trace
from ragsim.traces.traffic import SYSTEM_PROMPT_BASE_KEY
from ragsim.traces.validate import MAX_TOKENS, trace_from_tables

TRACE_FILE = "0_trace.jsonl"
SYSTEM_PROMPT = "sys_prompt"
PASSAGES = "passages_ids"


@dataclass(frozen=True)
class SegmentKind:
    """One kind of input segment: its key in ``hash_ids``, its length file and that file's id
    field, and whether it belongs to the cached path."""

    key: str
    file: str
    id_field: str
    in_path: bool
    min_tokens: int  # path segments become documents, which have at least one token


# in the order of ``hash_ids`` (and of the service's replay script)
SEGMENT_KINDS = (
    SegmentKind(SYSTEM_PROMPT, "1_sys_prompt.jsonl", "sys_prompt_id", True, 1),
    SegmentKind(PASSAGES, "2_passages.jsonl", "passage_id", True, 1),
    SegmentKind("history", "3_history.jsonl", "history_id", False, 0),
    SegmentKind("web_search", "5_web_search.jsonl", "web_search_id", False, 0),
    SegmentKind("user_input", "4_user_input.jsonl", "user_input_id", False, 0),
)

# system-prompt segment s is document SYSTEM_PROMPT_DOC_ID_BASE + s; passage p is document p
SYSTEM_PROMPT_DOC_ID_BASE = 10**12
WEEK_S = 7 * 24 * 3600
CLOCKS = ("weeks", "sorted")
# the README: timestamps are "measured from the beginning of the trace (12:00:00)"
CLOCK_ORIGIN_HOUR = 12
INFO_SOURCE = "ragpulse"


def find_file(directory: Path, name: str) -> Path:
    """``name`` in ``directory``, plain or compressed (``.xz``, ``.gz``, ``.bz2``)."""
    for suffix in ("", *_COMPRESSED_OPENERS):
        path = directory / f"{name}{suffix}"
        if path.is_file():
            return path
    raise TraceError(f"missing {name} (a RAGPulse folder holds {TRACE_FILE} and "
                     f"{', '.join(k.file for k in SEGMENT_KINDS)})", file=str(directory))


def _integer(obj: dict, key: str, src: str, row: int, minimum: int, maximum: int) -> int:
    if key not in obj:
        raise TraceError("missing", file=src, row=row, field=key)
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"must be an integer, got {_short(value)}", file=src, row=row,
                         field=key)
    if not minimum <= value <= maximum:
        raise TraceError(f"must lie in [{minimum:,}, {maximum:,}], got {_short(value)}",
                         file=src, row=row, field=key)
    return value


def read_lengths(path: Path, kind: SegmentKind) -> dict[int, int]:
    """``{id: token_length}`` of one length file; a repeated id is an error (which length
    would be the segment's?)."""
    src = str(path)
    lengths: dict[int, int] = {}
    first_line: dict[int, int] = {}
    for row, obj in iter_json_objects(path):
        segment = _integer(obj, kind.id_field, src, row, 0, SYSTEM_PROMPT_DOC_ID_BASE - 1)
        tokens = _integer(obj, "token_length", src, row, kind.min_tokens, MAX_TOKENS)
        if segment in lengths:
            raise TraceError(f"id {segment} listed again (first at line "
                             f"{first_line[segment]})", file=src, row=row, field=kind.id_field)
        lengths[segment] = tokens
        first_line[segment] = row
    return lengths


def _timestamp(obj: dict, src: str, row: int) -> float:
    """Seconds: a string of digits as published, or a JSON number."""
    if "timestamp" not in obj:
        raise TraceError("missing", file=src, row=row, field="timestamp")
    value = obj["timestamp"]
    number = None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value) if abs(value) < 1e300 else None
    if number is None or not np.isfinite(number) or number < 0:
        raise TraceError(f"must be a finite number of seconds >= 0, got {_short(value)}",
                         file=src, row=row, field="timestamp")
    return number


def _segment_ids(hash_ids: dict, kind: SegmentKind, src: str, row: int,
                 lengths: dict[int, int], length_file: str) -> list[int]:
    field = f"hash_ids.{kind.key}"
    if kind.key not in hash_ids:
        raise TraceError("missing", file=src, row=row, field=field)
    ids = hash_ids[kind.key]
    if not isinstance(ids, list):
        raise TraceError(f"must be a list of ids, got {_short(ids)}", file=src, row=row,
                         field=field)
    for segment in ids:
        if isinstance(segment, bool) or not isinstance(segment, int):
            raise TraceError(f"must hold integer ids, found {_short(segment)}", file=src,
                             row=row, field=field)
        if segment not in lengths:
            raise TraceError(f"id {_short(segment)} has no length in {length_file}", file=src,
                             row=row, field=field)
    return ids


def read_ragpulse(directory: str | os.PathLike, *, clock: str = "weeks") -> Trace:
    """The RAGPulse folder ``directory`` as a trace (module docstring: what each field becomes,
    and ``clock``)."""
    if clock not in CLOCKS:
        raise TraceError(f"unknown clock {clock!r}; choose one of {', '.join(CLOCKS)}",
                         field="--clock")
    folder = Path(directory)
    if not folder.is_dir():
        raise TraceError("not a folder (a RAGPulse folder holds 0_trace.jsonl and the length "
                         "files)", file=str(folder))
    trace_path = find_file(folder, TRACE_FILE)
    length_paths = {k.key: find_file(folder, k.file) for k in SEGMENT_KINDS}
    lengths = {k.key: read_lengths(length_paths[k.key], k) for k in SEGMENT_KINDS}
    src = str(trace_path)

    stamps: list[float] = []
    lines: list[int] = []
    paths: list[list[int]] = []
    path_tokens: list[int] = []
    query_tokens: list[int] = []
    output_tokens: list[int] = []
    sessions: list[str] = []
    parts = {k.key: 0 for k in SEGMENT_KINDS if not k.in_path}
    template_tokens: list[int] = []
    system_lengths = lengths[SYSTEM_PROMPT]
    passage_lengths = lengths[PASSAGES]
    for row, obj in iter_json_objects(trace_path):
        stamp = _timestamp(obj, src, row)
        input_length = _integer(obj, "input_length", src, row, 1, MAX_TOKENS)
        output_length = _integer(obj, "output_length", src, row, 0, MAX_TOKENS)
        hash_ids = obj.get("hash_ids")
        if not isinstance(hash_ids, dict):
            raise TraceError("missing" if hash_ids is None else
                             f"must be an object of id lists, got {_short(hash_ids)}",
                             file=src, row=row, field="hash_ids")
        ids = {k.key: _segment_ids(hash_ids, k, src, row, lengths[k.key],
                                   length_paths[k.key].name) for k in SEGMENT_KINDS}
        session = obj.get("session_id")
        if not isinstance(session, str):
            raise TraceError("missing" if session is None else
                             f"must be text, got {_short(session)}", file=src, row=row,
                             field="session_id")
        path = ([SYSTEM_PROMPT_DOC_ID_BASE + s for s in ids[SYSTEM_PROMPT]]
                + list(ids[PASSAGES]))
        if not path:
            raise TraceError("no system-prompt segment and no passage: nothing to cache",
                             file=src, row=row, field="hash_ids")
        cached = (sum(system_lengths[s] for s in ids[SYSTEM_PROMPT])
                  + sum(passage_lengths[p] for p in ids[PASSAGES]))
        others = {key: sum(lengths[key][s] for s in ids[key]) for key in parts}
        remainder = input_length - cached - sum(others.values())
        if remainder < 0:
            raise TraceError(f"{input_length:,} tokens, fewer than its listed segments' "
                             f"{input_length - remainder:,}", file=src, row=row,
                             field="input_length")
        for key, value in others.items():
            parts[key] += value
        template_tokens.append(remainder)
        stamps.append(stamp)
        lines.append(row)
        paths.append(path)
        path_tokens.append(cached)
        query_tokens.append(input_length - cached)
        output_tokens.append(output_length)
        sessions.append(session)
    if not paths:
        raise TraceError("no requests in file", file=src)

    arrival, blocks = _arrivals(np.asarray(stamps), lines, clock, src)
    order = np.argsort(arrival, kind="stable")  # ties keep the file's order
    lengths_of_paths = np.fromiter((len(paths[i]) for i in order), dtype=np.int64,
                                   count=len(order))
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths_of_paths, out=offsets[1:])
    flat = np.fromiter((d for i in order for d in paths[i]), dtype=np.int64,
                       count=int(offsets[-1]))
    doc_ids = np.array([SYSTEM_PROMPT_DOC_ID_BASE + s for s in system_lengths]
                       + list(passage_lengths), dtype=np.int64)
    doc_tokens = np.array(list(system_lengths.values()) + list(passage_lengths.values()),
                          dtype=np.int64)
    requests = pa.table({
        "request_id": pa.array(np.arange(len(order), dtype=np.int64)),
        "arrival_s": pa.array(arrival[order]),
        "query_tokens": pa.array(np.asarray(query_tokens, dtype=np.int64)[order]),
        "output_tokens": pa.array(np.asarray(output_tokens, dtype=np.int64)[order]),
        "doc_ids": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                            pa.array(flat)),
        "session_id": pa.array([sessions[i] for i in order], pa.string()),
    })
    documents = pa.table({"doc_id": pa.array(doc_ids), "tokens": pa.array(doc_tokens)})
    trace = trace_from_tables(requests, documents, requests_source=src,
                              documents_source=str(folder))
    template = np.asarray(template_tokens)
    trace.info = {
        "source": INFO_SOURCE,
        "folder": folder.name,
        "clock": clock,
        "clock_blocks": blocks,
        "clock_origin_hour": CLOCK_ORIGIN_HOUR,
        SYSTEM_PROMPT_BASE_KEY: SYSTEM_PROMPT_DOC_ID_BASE,
        "path": "system-prompt segments, then passages, in the order listed",
        "query_tokens_parts": {**parts, "template": int(template.sum())},
        "template_tokens_min": int(template.min()),
        "template_tokens_max": int(template.max()),
        "passages": len(passage_lengths),
        "system_prompt_segments": len(system_lengths),
    }
    return trace


def _arrivals(stamps: np.ndarray, lines: list[int], clock: str, src: str
              ) -> tuple[np.ndarray, list[dict]]:
    """Arrival seconds of each request in file order, and the clock's blocks (first line,
    requests, shift) for the trace's info."""
    if clock == "sorted":
        return stamps.astype(np.float64), [{"first_line": lines[0], "requests": len(stamps),
                                            "shift_s": 0}]
    starts = [0, *(int(i) + 1 for i in np.flatnonzero(np.diff(stamps) < 0))]
    ends = [*starts[1:], len(stamps)]
    arrival = np.empty(len(stamps), dtype=np.float64)
    blocks = []
    for b, (lo, hi) in enumerate(zip(starts, ends, strict=True)):
        late = np.flatnonzero(stamps[lo:hi] >= WEEK_S)
        if len(late):
            row = lines[lo + int(late[0])]
            raise TraceError(f"{stamps[lo + int(late[0])]:g} s, a week or more into a block "
                             "that restarts its clock weekly; read the file on one clock with "
                             "--clock sorted", file=src, row=row, field="timestamp")
        arrival[lo:hi] = stamps[lo:hi] + b * WEEK_S
        blocks.append({"first_line": lines[lo], "requests": hi - lo, "shift_s": b * WEEK_S})
    return arrival, blocks

