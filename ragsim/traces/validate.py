"""Checks that turn Arrow tables into a ``Trace`` or fail naming file, row and field.

Rows are numbered from 0 in Parquet tables and from 1 (the line number) in JSONL files.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ragsim.errors import TraceError
from ragsim.limits import MAX_DURATION_S
from ragsim.traces.schema import (
    INFO_KEY,
    OPTIONAL_DOCUMENT_COLUMNS,
    OPTIONAL_REQUEST_COLUMNS,
    REQUIRED_DOCUMENT_COLUMNS,
    REQUIRED_REQUEST_COLUMNS,
    TRACE_VERSION,
    VERSION_KEY,
    Trace,
)

# Token counts: no model reads 2**31 tokens, and sums of such counts over a trace stay far
# inside int64 (a JSON integer has no bound: one past 64 bits ended in an OverflowError).
MAX_TOKENS = 2**31 - 1
# Ids: anything an int64 column holds (a uint64 column may hold more).
MIN_ID, MAX_ID = -(2**63), 2**63 - 1


def check_version(schema: pa.Schema, source: str) -> None:
    meta = schema.metadata or {}
    if VERSION_KEY not in meta:
        raise TraceError(f"no {VERSION_KEY.decode()} in the Parquet metadata; is this a ragsim "
                         "trace?", file=source, field="version")
    version = meta[VERSION_KEY].decode()
    if version != str(TRACE_VERSION):
        raise TraceError(f"trace version {version}, this ragsim reads version {TRACE_VERSION}",
                         file=source, field="version")


def check_columns(table: pa.Table, required: tuple, optional: tuple, source: str) -> None:
    names = table.column_names
    unknown = [c for c in names if c not in required + optional]
    if unknown:
        raise TraceError(f"unknown column(s) {unknown}; allowed: {list(required + optional)}",
                         file=source, field=unknown[0])
    for column in required:
        if column not in names:
            raise TraceError("missing required column", file=source, field=column)


def _first_bad(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if len(idx) else None


def _integer_column(table: pa.Table, name: str, source: str) -> np.ndarray:
    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise TraceError(f"must hold integers, found type {column.type}", file=source, field=name)
    if column.null_count:
        row = _first_bad(column.is_null().to_numpy(zero_copy_only=False))
        raise TraceError("missing value", file=source, row=row, field=name)
    values = column.to_numpy()
    _fits_int64(values, source, name)
    return values.astype(np.int64, copy=False)


def _fits_int64(values: np.ndarray, source: str, name: str, row_of=None) -> None:
    """uint64 values past int64's range would wrap to negative numbers when converted."""
    if values.dtype == np.uint64 and len(values):
        bad = _first_bad(values > np.uint64(MAX_ID))
        if bad is not None:
            row = bad if row_of is None else row_of(bad)
            raise TraceError(f"{values[bad]} is past the int64 range", file=source, row=row,
                             field=name)


def _at_most(values: np.ndarray, maximum: int, source: str, name: str) -> None:
    row = _first_bad(values > maximum)
    if row is not None:
        raise TraceError(f"must be <= {maximum:,}, got {values[row]}", file=source, row=row,
                         field=name)


def _integer_list_column(table: pa.Table, name: str, source: str) -> tuple[np.ndarray,
                                                                          np.ndarray]:
    column = table.column(name).combine_chunks()
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise TraceError(f"must be a list of integers, found type {column.type}", file=source,
                         field=name)
    if not pa.types.is_integer(column.type.value_type):
        raise TraceError(f"list items must be integers, found {column.type.value_type}",
                         file=source, field=name)
    if column.null_count:
        row = _first_bad(column.is_null().to_numpy(zero_copy_only=False))
        raise TraceError("missing list", file=source, row=row, field=name)
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.slice(offsets[0], offsets[-1] - offsets[0])
    if values.null_count:
        pos = _first_bad(values.is_null().to_numpy(zero_copy_only=False))
        row = int(np.searchsorted(offsets, pos + offsets[0], side="right") - 1)
        raise TraceError("missing id inside the list", file=source, row=row, field=name)
    flat = values.to_numpy()
    _fits_int64(flat, source, name,
                lambda pos: int(np.searchsorted(offsets, pos + offsets[0], side="right") - 1))
    return offsets - offsets[0], flat.astype(np.int64)


def documents_from_table(table: pa.Table, source: str) -> tuple[np.ndarray, np.ndarray,
                                                                 pa.Array | None]:
    check_columns(table, REQUIRED_DOCUMENT_COLUMNS, OPTIONAL_DOCUMENT_COLUMNS, source)
    ids = _integer_column(table, "doc_id", source)
    tokens = _integer_column(table, "tokens", source)
    row = _first_bad(tokens <= 0)
    if row is not None:
        raise TraceError(f"document size must be > 0 tokens, got {tokens[row]}", file=source,
                         row=row, field="tokens")
    _at_most(tokens, MAX_TOKENS, source, "tokens")
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    dup = _first_bad(sorted_ids[1:] == sorted_ids[:-1])
    if dup is not None:
        raise TraceError(f"duplicate doc_id {sorted_ids[dup]}", file=source,
                         row=int(order[dup + 1]), field="doc_id")
    text = None
    if "text" in table.column_names:
        text = table.column("text").combine_chunks().take(pa.array(order))
    return sorted_ids, tokens[order], text


def trace_from_tables(requests: pa.Table, documents: pa.Table, *, requests_source: str,
                      documents_source: str) -> Trace:
    src = requests_source
    check_columns(requests, REQUIRED_REQUEST_COLUMNS, OPTIONAL_REQUEST_COLUMNS, src)
    document_ids, document_tokens, document_text = documents_from_table(documents,
                                                                        documents_source)
    request_id = _integer_column(requests, "request_id", src)
    arrival = requests.column("arrival_s")
    if not (pa.types.is_floating(arrival.type) or pa.types.is_integer(arrival.type)):
        raise TraceError(f"must be a number of seconds, found type {arrival.type}", file=src,
                         field="arrival_s")
    if arrival.null_count:
        raise TraceError("missing value", file=src,
                         row=_first_bad(arrival.is_null().to_numpy(zero_copy_only=False)),
                         field="arrival_s")
    arrival_s = arrival.to_numpy().astype(np.float64)
    row = _first_bad(~np.isfinite(arrival_s) | (arrival_s < 0))
    if row is not None:
        raise TraceError(f"arrival time must be finite and >= 0, got {arrival_s[row]}",
                         file=src, row=row, field="arrival_s")
    row = _first_bad(np.diff(arrival_s) < 0)
    if row is not None:
        raise TraceError(
            f"arrival time goes backwards ({arrival_s[row + 1]} after {arrival_s[row]}); "
            "ragsim refuses unsorted traces: sort the requests by arrival_s first",
            file=src, row=row + 1, field="arrival_s")
    order = np.sort(request_id)
    dup = _first_bad(order[1:] == order[:-1])
    if dup is not None:
        row = int(np.flatnonzero(request_id == order[dup])[1])
        raise TraceError(f"duplicate request_id {order[dup]}", file=src, row=row,
                         field="request_id")
    query_tokens = _integer_column(requests, "query_tokens", src)
    output_tokens = _integer_column(requests, "output_tokens", src)
    for name, values in (("query_tokens", query_tokens), ("output_tokens", output_tokens)):
        row = _first_bad(values < 0)
        if row is not None:
            raise TraceError(f"must be >= 0, got {values[row]}", file=src, row=row, field=name)
        _at_most(values, MAX_TOKENS, src, name)
    doc_offsets, doc_ids = _integer_list_column(requests, "doc_ids", src)
    has_history = None
    if "has_history" in requests.column_names:
        column = requests.column("has_history")
        if not pa.types.is_boolean(column.type):
            raise TraceError(f"must be boolean, found {column.type}", file=src,
                             field="has_history")
        has_history = column.fill_null(False).to_numpy(zero_copy_only=False)
    # every request needs documents unless it is a multi-turn request that skips retrieval
    empty = np.diff(doc_offsets) == 0
    if has_history is not None:
        empty &= ~has_history
    row = _first_bad(empty)
    if row is not None:
        raise TraceError("empty document list; a RAG request needs at least one document",
                         file=src, row=row, field="doc_ids")
    _check_known(doc_ids, doc_offsets, document_ids, src, "doc_ids", documents_source)
    stages = None
    if "stages" in requests.column_names:
        stages = _check_stages(requests.column("stages").combine_chunks(), document_ids, src)
    stage_times_s = None
    if "stage_times_s" in requests.column_names:
        stage_times_s = _check_stage_times(requests.column("stage_times_s").combine_chunks(),
                                           stages, src)
    text_columns = {}
    for name in ("query_text", "answer_key"):
        if name in requests.column_names:
            column = requests.column(name).combine_chunks()
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                    or pa.types.is_null(column.type)):
                raise TraceError(f"must be text, found {column.type}", file=src, field=name)
            text_columns[name] = column
    query_embedding = None
    if "query_embedding" in requests.column_names:
        query_embedding = _check_embeddings(requests.column("query_embedding").combine_chunks(),
                                            src)
    session_id = None
    if "session_id" in requests.column_names:
        session_id = _check_session_ids(requests.column("session_id").combine_chunks(), src)
    info = _trace_info(requests, src)
    return Trace(
        request_id=request_id,
        arrival_s=arrival_s,
        query_tokens=query_tokens,
        output_tokens=output_tokens,
        doc_offsets=doc_offsets,
        doc_ids=doc_ids,
        document_ids=document_ids,
        document_tokens=document_tokens,
        stages=stages,
        stage_times_s=stage_times_s,
        query_text=text_columns.get("query_text"),
        answer_key=text_columns.get("answer_key"),
        has_history=has_history,
        query_embedding=query_embedding,
        session_id=session_id,
        document_text=document_text,
        info=info,
    )


def _trace_info(requests: pa.Table, src: str) -> dict:
    """The trace's description (``ragsim.trace_info``): a JSON object, or none at all."""
    from ragsim.user_files import parse_json

    raw = (requests.schema.metadata or {}).get(INFO_KEY)
    if not raw:
        return {}
    field = INFO_KEY.decode()
    info = parse_json(raw, source=src, error=TraceError, field=field)
    if not isinstance(info, dict):
        raise TraceError(f"the trace's description must be a JSON object, found "
                         f"{type(info).__name__}", file=src, field=field)
    return info


def _check_known(ids: np.ndarray, offsets: np.ndarray, known: np.ndarray, src: str, field: str,
                 documents_source: str) -> None:
    if len(ids) == 0:
        return
    pos = np.searchsorted(known, ids)
    pos_clipped = np.minimum(pos, len(known) - 1)
    missing = (len(known) == 0) | (known[pos_clipped] != ids) if len(known) else np.ones(
        len(ids), bool)
    bad = _first_bad(missing)
    if bad is not None:
        row = int(np.searchsorted(offsets, bad, side="right") - 1)
        raise TraceError(f"document {ids[bad]} is not in the documents table "
                         f"({documents_source})", file=src, row=row, field=field)


def _check_stages(column: pa.Array, known: np.ndarray, src: str) -> pa.Array:
    outer_ok = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
    inner = column.type.value_type if outer_ok else None
    if not (outer_ok and (pa.types.is_list(inner) or pa.types.is_large_list(inner))
            and pa.types.is_integer(inner.value_type)):
        raise TraceError(f"must be a list of lists of integers, found {column.type}", file=src,
                         field="stages")
    # a request's whole entry may be null (no stages recorded for it); a null inside it is a
    # broken list, which flattening would drop without a word
    flat_stage_lists = pc.list_flatten(column)
    stage_parent = pc.list_parent_indices(column).to_numpy()
    if flat_stage_lists.null_count:
        bad = _first_bad(flat_stage_lists.is_null().to_numpy(zero_copy_only=False))
        raise TraceError("missing stage list (null) inside the stages", file=src,
                         row=int(stage_parent[bad]), field="stages")
    ids = pc.list_flatten(flat_stage_lists)
    if ids.null_count:
        id_parent = pc.list_parent_indices(flat_stage_lists).to_numpy()
        bad = _first_bad(ids.is_null().to_numpy(zero_copy_only=False))
        raise TraceError("missing id (null) inside a stage list", file=src,
                         row=int(stage_parent[id_parent[bad]]), field="stages")
    flat_ids = ids.to_numpy(zero_copy_only=False)
    if len(flat_ids):
        # map each id back to its request for the error message
        id_parent = pc.list_parent_indices(flat_stage_lists).to_numpy()
        request_of_id = stage_parent[id_parent]
        pos = np.minimum(np.searchsorted(known, flat_ids), len(known) - 1)
        bad = _first_bad(known[pos] != flat_ids)
        if bad is not None:
            raise TraceError(f"document {flat_ids[bad]} is not in the documents table",
                             file=src, row=int(request_of_id[bad]), field="stages")
    return column.cast(pa.list_(pa.list_(pa.int64())))


def _check_embeddings(column: pa.Array, src: str) -> np.ndarray:
    """Query embeddings: a list of numbers per request, every one of the same length, finite
    and not all zero (a cosine needs a direction). Returned as float32 (n, dimension)."""
    field = "query_embedding"
    kinds = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if not (any(k(column.type) for k in kinds)
            and (pa.types.is_floating(column.type.value_type)
                 or pa.types.is_integer(column.type.value_type))):
        raise TraceError(f"must be a list of numbers, found {column.type}", file=src,
                         field=field)
    if column.null_count:
        row = _first_bad(column.is_null().to_numpy(zero_copy_only=False))
        raise TraceError("missing embedding", file=src, row=row, field=field)
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if len(lengths) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    row = _first_bad(lengths != lengths[0])
    if row is not None:
        raise TraceError(f"{lengths[row]} numbers, row 0 has {lengths[0]}: every embedding "
                         "must have the same dimension", file=src, row=row, field=field)
    if lengths[0] < 1:
        raise TraceError("empty embedding", file=src, row=0, field=field)
    values = pc.list_flatten(column)
    if values.null_count:
        pos = _first_bad(values.is_null().to_numpy(zero_copy_only=False))
        raise TraceError("missing number inside the embedding", file=src,
                         row=int(pos // lengths[0]), field=field)
    flat = values.to_numpy(zero_copy_only=False).astype(np.float64)
    bad = _first_bad(~np.isfinite(flat))
    if bad is not None:
        raise TraceError(f"must be finite, got {flat[bad]}", file=src,
                         row=int(bad // lengths[0]), field=field)
    vectors = flat.reshape(len(lengths), int(lengths[0]))
    row = _first_bad(~(np.abs(vectors) > 0).any(axis=1))
    if row is not None:
        raise TraceError("an all-zero embedding has no direction (cosine)", file=src, row=row,
                         field=field)
    with np.errstate(over="ignore"):  # past float32's range: inf, refused just below
        converted = vectors.astype(np.float32)
    row = _first_bad(~np.isfinite(converted).all(axis=1))
    if row is not None:
        raise TraceError("a number is past the float32 range", file=src, row=row, field=field)
    return converted


def _check_session_ids(column: pa.Array, src: str) -> pa.Array:
    """Session ids: text, one per request (a request outside any session has no place in a
    session statistic, so a missing value is an error rather than a session of its own)."""
    field = "session_id"
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise TraceError(f"must be text, found {column.type}", file=src, field=field)
    if column.null_count:
        raise TraceError("missing value", file=src,
                         row=_first_bad(column.is_null().to_numpy(zero_copy_only=False)),
                         field=field)
    return column.cast(pa.string())


def _check_stage_times(column: pa.Array, stages: pa.Array | None, src: str) -> pa.Array:
    """Per-stage search times: finite, >= 0, one per recorded stage (they describe the stages,
    so a trace cannot have times without stages), none past MAX_DURATION_S (a day-long stage
    is a unit mistake; refused here, the message names the file, not only when a run reads
    the times)."""
    field = "stage_times_s"
    if stages is None:
        raise TraceError("stage times need a 'stages' column to describe", file=src, field=field)
    if not ((pa.types.is_list(column.type) or pa.types.is_large_list(column.type))
            and (pa.types.is_floating(column.type.value_type)
                 or pa.types.is_integer(column.type.value_type))):
        raise TraceError(f"must be a list of numbers of seconds, found {column.type}",
                         file=src, field=field)
    column = column.cast(pa.list_(pa.float64()))
    times_len = pc.fill_null(pc.list_value_length(column), 0).to_numpy()
    stages_len = pc.fill_null(pc.list_value_length(stages), 0).to_numpy()
    row = _first_bad(times_len != stages_len)
    if row is not None:
        raise TraceError(f"{times_len[row]} time(s) for {stages_len[row]} stage(s)", file=src,
                         row=row, field=field)
    flat = pc.list_flatten(column)
    if flat.null_count:
        bad = _first_bad(flat.is_null().to_numpy(zero_copy_only=False))
        row = int(pc.list_parent_indices(column).to_numpy()[bad])
        raise TraceError("missing time (null) inside the list", file=src, row=row, field=field)
    values = flat.to_numpy(zero_copy_only=False)
    bad = _first_bad(~np.isfinite(values) | (values < 0))
    if bad is not None:
        row = int(pc.list_parent_indices(column).to_numpy()[bad])
        raise TraceError(f"must be finite and >= 0, got {values[bad]}", file=src, row=row,
                         field=field)
    bad = _first_bad(values > MAX_DURATION_S)
    if bad is not None:
        row = int(pc.list_parent_indices(column).to_numpy()[bad])
        raise TraceError(f"a search stage of {values[bad]:.4g} s is longer than "
                         f"{MAX_DURATION_S:,.0f} s (30 days): are the times in seconds?",
                         file=src, row=row, field=field)
    return column
