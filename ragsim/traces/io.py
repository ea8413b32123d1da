"""Reading and writing traces: Parquet directories, the JSONL interchange format, Mooncake."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragsim.atomic import write_atomically
from ragsim.errors import TraceError
from ragsim.outputs import SET_ID_KEY, new_set_id
from ragsim.traces.schema import Trace
from ragsim.traces.validate import (
    MAX_ID,
    MAX_TOKENS,
    MIN_ID,
    check_version,
    trace_from_tables,
)
from ragsim.user_files import MAX_LINE_BYTES, is_regular_file, open_user_file, parse_json

REQUESTS_FILE = "requests.parquet"
DOCUMENTS_FILE = "documents.parquet"


def write_trace(trace: Trace, directory: str | os.PathLike) -> Path:
    """Write ``requests.parquet`` and ``documents.parquet`` atomically into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    set_id = new_set_id().encode()  # the two files are one trace: a cut write is told apart
    written: list[Path] = []
    try:
        for name, table in ((REQUESTS_FILE, trace.requests_table()),
                            (DOCUMENTS_FILE, trace.documents_table())):
            table = table.replace_schema_metadata({**table.schema.metadata, SET_ID_KEY: set_id})
            write_atomically(out / name, lambda tmp, table=table: pq.write_table(table, tmp))
            written.append(out / name)
    except OSError:  # a write a full disk cut short leaves no half of a trace
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return out


def read_trace(path: str | os.PathLike) -> Trace:
    """A trace directory, a ``requests.parquet`` inside one, or a ``.jsonl`` file."""
    p = Path(path)
    if p.is_file() and p.suffix == ".jsonl":
        return read_jsonl(p)
    if p.is_file() and p.name == REQUESTS_FILE:
        p = p.parent
    if not p.exists():
        raise TraceError("no such trace file or directory", file=str(p))
    if not p.is_dir():
        raise TraceError("a trace is a directory with requests.parquet and documents.parquet, "
                         "or a .jsonl file", file=str(p))
    tables = {}
    for name in (REQUESTS_FILE, DOCUMENTS_FILE):
        f = p / name
        if not f.exists():
            raise TraceError(f"missing {name}", file=str(p))
        if not is_regular_file(f):  # a FIFO would block the reader, a device never end
            raise TraceError("not a regular file; give the trace's Parquet file", file=str(f))
        try:
            tables[name] = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceError(f"not a readable Parquet file: {exc}", file=str(f)) from exc
        check_version(tables[name].schema, str(f))
    if tables[REQUESTS_FILE].num_rows == 0:  # as an empty JSONL file is: nothing to run
        raise TraceError("no requests in the table", file=str(p / REQUESTS_FILE))
    ids = {name: (tables[name].schema.metadata or {}).get(SET_ID_KEY) for name in tables}
    if None not in ids.values() and len(set(ids.values())) > 1:
        raise TraceError(f"{REQUESTS_FILE} and {DOCUMENTS_FILE} come from two different writes "
                         "(one was cut short, or a file was copied in): write the trace again",
                         file=str(p))
    return trace_from_tables(tables[REQUESTS_FILE], tables[DOCUMENTS_FILE],
                             requests_source=str(p / REQUESTS_FILE),
                             documents_source=str(p / DOCUMENTS_FILE))


# --------------------------------------------------------------------------- building
class TraceBuilder:
    """Accumulates requests and first-seen document sizes, then validates into a ``Trace``.

    A document's size is fixed the first time it is seen; a later, different size is not an
    error (real logs disagree) but is counted in ``size_mismatches`` and reported.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.arrival_s: list[float] = []
        self.query_tokens: list[int] = []
        self.output_tokens: list[int] = []
        self.doc_lists: list[list[int]] = []
        self.doc_tokens: dict[int, int] = {}
        self.size_mismatches = 0
        self.first_mismatch: str | None = None

    def add(self, row: int, arrival_s: float, query_tokens: int, output_tokens: int,
            doc_ids: list[int], doc_tokens: list[int] | None) -> None:
        self.arrival_s.append(arrival_s)
        self.query_tokens.append(query_tokens)
        self.output_tokens.append(output_tokens)
        self.doc_lists.append(doc_ids)
        sizes = self.doc_tokens
        for i, doc in enumerate(doc_ids):
            size = doc_tokens[i] if doc_tokens is not None else None
            known = sizes.get(doc)
            if known is None:
                if size is None:
                    raise TraceError(f"document {doc} appears for the first time without a "
                                     "size", file=self.source, row=row, field="doc_tokens")
                sizes[doc] = size
            elif size is not None and size != known:
                self.size_mismatches += 1
                if self.first_mismatch is None:
                    self.first_mismatch = (f"row {row}: document {doc} has {size} tokens, "
                                           f"first seen with {known} (kept)")

    def build(self, info: dict) -> Trace:
        n = len(self.doc_lists)
        lengths = np.fromiter((len(d) for d in self.doc_lists), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((d for docs in self.doc_lists for d in docs), dtype=np.int64,
                           count=int(offsets[-1]))
        doc_ids = np.fromiter(self.doc_tokens.keys(), dtype=np.int64, count=len(self.doc_tokens))
        doc_tok = np.fromiter(self.doc_tokens.values(), dtype=np.int64,
                              count=len(self.doc_tokens))
        requests = pa.table({
            "request_id": pa.array(np.arange(n, dtype=np.int64)),
            "arrival_s": pa.array(np.asarray(self.arrival_s, dtype=np.float64)),
            "query_tokens": pa.array(np.asarray(self.query_tokens, dtype=np.int64)),
            "output_tokens": pa.array(np.asarray(self.output_tokens, dtype=np.int64)),
            "doc_ids": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                                pa.array(flat)),
        })
        documents = pa.table({"doc_id": pa.array(doc_ids), "tokens": pa.array(doc_tok)})
        info = dict(info)
        if self.size_mismatches:
            info["document_size_mismatches"] = self.size_mismatches
            info["first_size_mismatch"] = self.first_mismatch
        trace = trace_from_tables(requests, documents, requests_source=self.source,
                                  documents_source=self.source)
        trace.info = info
        return trace


_COMPRESSED_OPENERS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}


def _lines(handle, path: Path) -> Iterable[bytes]:
    """The file's lines, none longer than MAX_LINE_BYTES (a file of one endless line, or a
    compressed bomb, is refused at the bound, not read into memory); a corrupt compressed
    stream ends with the file named, not a traceback."""
    line_no = 0
    try:
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            line_no += 1
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(f"a line longer than {MAX_LINE_BYTES // 2**20} MiB: is this "
                                 "a JSON-lines file?", file=str(path), row=line_no)
            yield raw
    except (lzma.LZMAError, EOFError, OSError) as exc:
        raise TraceError(f"cannot read (corrupt or truncated compressed file?): {exc}",
                         file=str(path)) from exc


def iter_json_objects(path: Path) -> Iterable[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file, streamed; every problem
    (not a regular file, unreadable, bytes that are not UTF-8, bad or too deeply nested JSON, a
    line that is not an object) names the file and line. The one JSONL reader: traces and
    ``trace build``'s corpora use it. A ``.xz``, ``.gz`` or ``.bz2`` file is decompressed as it
    is read (public traces ship compressed: Mooncake's, in tests/data)."""
    raw_file = open_user_file(path, error=TraceError)
    opener = _COMPRESSED_OPENERS.get(Path(path).suffix.lower())
    try:
        handle = opener(raw_file, "rb") if opener is not None else raw_file
    except OSError as exc:
        raw_file.close()
        raise TraceError(f"cannot open: {exc}", file=str(path)) from exc
    with raw_file, handle:
        for line_no, raw in enumerate(_lines(handle, path), start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start:exc.start + 1]
                raise TraceError(f"not UTF-8 text (byte {exc.start}: {bad!r})", file=str(path),
                                 row=line_no) from exc
            obj = parse_json(text, source=str(path), error=TraceError, row=line_no)
            if not isinstance(obj, dict):
                raise TraceError("each line must be a JSON object", file=str(path), row=line_no)
            yield line_no, obj


def _short(value: object) -> str:
    """A value for an error message, cut short (a 400-digit integer helps nobody)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int_field(obj: dict, key: str, src: str, row: int, *, minimum: int | None = 0,
               maximum: int = MAX_TOKENS, default: int | None = None) -> int:
    if key not in obj:
        if default is not None:
            return default
        raise TraceError("missing", file=src, row=row, field=key)
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"must be an integer, got {_short(value)}", file=src, row=row,
                         field=key)
    if minimum is not None and value < minimum:
        raise TraceError(f"must be >= {minimum}, got {_short(value)}", file=src, row=row,
                         field=key)
    if value > maximum:
        raise TraceError(f"must be <= {maximum:,}, got {_short(value)}", file=src, row=row,
                         field=key)
    return value


def _int_list(obj: dict, key: str, src: str, row: int, *, minimum: int = MIN_ID,
              maximum: int = MAX_ID) -> list[int]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise TraceError(f"must be a list of integers, got {_short(value)}", file=src, row=row,
                         field=key)
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise TraceError(f"must hold integers, found {_short(item)}", file=src, row=row,
                             field=key)
        if not minimum <= item <= maximum:
            raise TraceError(f"entries must lie in [{minimum}, {maximum}], found "
                             f"{_short(item)}", file=src, row=row, field=key)
    return value


def _seconds(value: object, src: str, row: int, key: str, unit: str) -> float:
    """A finite, non-negative number of ``unit`` as a float (an integer too large for a float
    is refused here, where ``math.isfinite`` raised OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"must be a number of {unit}, got {_short(value)}", file=src, row=row,
                         field=key)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise TraceError(f"must be a finite number of {unit} >= 0, got {_short(value)}",
                         file=src, row=row, field=key)
    return number


JSONL_FIELDS = {"arrival_s", "query_tokens", "output_tokens", "doc_ids", "doc_tokens"}


def read_jsonl(path: str | os.PathLike) -> Trace:
    """The JSONL interchange format, one request per line::

        {"arrival_s": 0.0, "query_tokens": 60, "output_tokens": 32,
         "doc_ids": [7, 3], "doc_tokens": [812, 430]}
    """
    p = Path(path)
    src = str(p)
    builder = TraceBuilder(src)
    last_time = 0.0
    for row, obj in iter_json_objects(p):
        unknown = set(obj) - JSONL_FIELDS
        if unknown:
            hint = ("; this looks like a Mooncake trace: convert it with 'ragsim trace "
                    "import-mooncake'" if {"timestamp", "hash_ids"} <= unknown else "")
            raise TraceError(f"unknown field(s) {sorted(unknown)}; allowed: "
                             f"{sorted(JSONL_FIELDS)}{hint}", file=src, row=row,
                             field=sorted(unknown)[0])
        t = _seconds(obj.get("arrival_s"), src, row, "arrival_s", "seconds")
        if t < last_time:
            raise TraceError(f"arrival time goes backwards ({t} after {last_time}); ragsim "
                             "refuses unsorted traces: sort the lines by arrival_s",
                             file=src, row=row, field="arrival_s")
        last_time = t
        docs = _int_list(obj, "doc_ids", src, row)
        if not docs:
            raise TraceError("empty document list", file=src, row=row, field="doc_ids")
        sizes = None
        if "doc_tokens" in obj:
            sizes = _int_list(obj, "doc_tokens", src, row, minimum=1, maximum=MAX_TOKENS)
            if len(sizes) != len(docs):
                raise TraceError(f"has {len(sizes)} entries for {len(docs)} documents",
                                 file=src, row=row, field="doc_tokens")
        builder.add(row, t, _int_field(obj, "query_tokens", src, row),
                    _int_field(obj, "output_tokens", src, row), docs, sizes)
    if not builder.doc_lists:
        raise TraceError("no requests in file", file=src)
    return builder.build({"source": "jsonl", "file": p.name})


def write_jsonl(trace: Trace, path: str | os.PathLike) -> Path:
    """Export in the interchange format; ``doc_tokens`` carries every document's size."""
    out = Path(path)
    tokens_flat = trace.doc_tokens_flat.tolist()
    ids_flat = trace.doc_ids.tolist()
    offsets = trace.doc_offsets.tolist()
    arrival = trace.arrival_s.tolist()
    query = trace.query_tokens.tolist()
    output = trace.output_tokens.tolist()

    def write(tmp: Path) -> None:
        with tmp.open("w") as handle:
            for i in range(trace.n_requests):
                lo, hi = offsets[i], offsets[i + 1]
                handle.write(json.dumps({
                    "arrival_s": arrival[i],
                    "query_tokens": query[i],
                    "output_tokens": output[i],
                    "doc_ids": ids_flat[lo:hi],
                    "doc_tokens": tokens_flat[lo:hi],
                }) + "\n")

    write_atomically(out, write)
    return out


MOONCAKE_BLOCK_TOKENS = 512


def read_mooncake(path: str | os.PathLike) -> Trace:
    """Mooncake's public traces: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids`` (ids of 512-token blocks chained by prefix).

    Each block becomes a document of 512 tokens, the last one ``input_length - 512*(n-1)``;
    the whole input is blocks, so ``query_tokens`` is 0. A block id met again with another size
    (a partial last block elsewhere) keeps its first size; mismatches are counted in the info.
    """
    p = Path(path)
    src = str(p)
    builder = TraceBuilder(src)
    last_ms = 0.0
    # Mooncake's hash ids are chained by prefix: a block's id covers every block before it, so
    # an id always follows the same id (or starts the list). One that does not is counted:
    # the knowledge tree still keys blocks by their prefix (the same id under two prefixes is
    # two nodes), but the file is not what the format says, so the import says so
    before: dict[int, tuple[int | None, int]] = {}
    unchained_rows, first_unchained = 0, None
    for row, obj in iter_json_objects(p):
        ts = _seconds(obj.get("timestamp"), src, row, "timestamp", "milliseconds")
        if ts < last_ms:
            raise TraceError(f"timestamp goes backwards ({ts} after {last_ms})", file=src,
                             row=row, field="timestamp")
        last_ms = ts
        input_length = _int_field(obj, "input_length", src, row, minimum=1)
        output_length = _int_field(obj, "output_length", src, row)
        blocks = _int_list(obj, "hash_ids", src, row, minimum=0)
        if not blocks:
            raise TraceError("empty block list", file=src, row=row, field="hash_ids")
        last = input_length - MOONCAKE_BLOCK_TOKENS * (len(blocks) - 1)
        if not 0 < last <= MOONCAKE_BLOCK_TOKENS:
            raise TraceError(f"{len(blocks)} blocks of {MOONCAKE_BLOCK_TOKENS} tokens do not "
                             f"cover input_length {input_length}", file=src, row=row,
                             field="input_length")
        sizes = [MOONCAKE_BLOCK_TOKENS] * (len(blocks) - 1) + [last]
        unchained = None
        previous = None
        for block in blocks:
            seen = before.setdefault(block, (previous, row))
            if seen[0] != previous and unchained is None:
                unchained = (f"row {row}: block {block} follows {previous}, at row {seen[1]} "
                             f"it followed {seen[0]}")
            previous = block
        if unchained is not None:
            unchained_rows += 1
            first_unchained = first_unchained or unchained
        builder.add(row, ts / 1000.0, 0, output_length, blocks, sizes)
    if not builder.doc_lists:
        raise TraceError("no requests in file", file=src)
    # prefix blocks of conversations, not retrieved documents: no vector search chose them
    info = {"source": "mooncake", "file": p.name, "block_tokens": MOONCAKE_BLOCK_TOKENS,
            "retrieval": False}
    if unchained_rows:
        info["unchained_block_rows"] = unchained_rows
        info["first_unchained_block"] = first_unchained
    return builder.build(info)
