"""Fuzzing the readers of user files: every malformed input ends in a RagsimInputError that
names the file (and the row and field where there is one), never in another exception.

Each test starts from a valid file and breaks it the ways a hand-written or converted file
breaks: a field dropped, an unknown one added, a value of the wrong type, negative, past 64
bits, NaN or infinite. The examples are few (the readers are fast, the suite must stay so);
hypothesis keeps the failures it finds in its database and replays them first.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w
from helpers import scratch_dir
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragsim.errors import RagsimInputError
from ragsim.profiles.profile import Profile, load_profile
from ragsim.serving.config import SimConfig, build_config, load_config_file
from ragsim.traces.io import read_jsonl, read_mooncake, read_trace
from ragsim.traces.schema import VERSION_KEY

# RAGSIM_FUZZ_EXAMPLES=2000 searches harder (minutes), e.g. after changing a reader
EXAMPLES = int(os.environ.get("RAGSIM_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# values a broken file holds where a number, a list or a string belongs
BIG = st.sampled_from([2**63, 2**64 + 5, -(2**63) - 1, 10**30, -(10**30), 10**400])
SCALARS = st.one_of(
    st.integers(-5, 5), st.integers(-(2**70), 2**70), BIG,
    st.floats(allow_nan=True, allow_infinity=True), st.just(float("nan")),
    st.just(float("inf")), st.booleans(), st.none(), st.text(max_size=5))
JUNK = st.one_of(SCALARS, st.lists(SCALARS, max_size=4),
                 st.dictionaries(st.text(max_size=3), SCALARS, max_size=2))


def _workdir() -> Path:
    """A fresh folder per example (pytest's tmp_path is one per test, not per example)."""
    return scratch_dir("ragsim-fuzz-")


def assert_clean(read, where: Path) -> object | None:
    """``read()`` returns, or raises a RagsimInputError naming the file (``where`` or a file in
    it), and a row or a field unless the problem is the whole file's (empty, unreadable, a
    missing table)."""
    try:
        return read()
    except RagsimInputError as exc:
        assert exc.file is not None and str(exc.file).startswith(str(where)), exc
        whole_file = ("no requests", "missing ", "not a readable", "not readable", "not valid",
                      "expected a JSON object", "not valid TOML", "no such")
        assert exc.field is not None or exc.row is not None or any(
            w in exc.detail for w in whole_file), exc
        return None


# --------------------------------------------------------------------------- JSONL traces
GOOD_ROW = {"arrival_s": 1.0, "query_tokens": 20, "output_tokens": 4, "doc_ids": [1, 2],
            "doc_tokens": [100, 50]}
GOOD_MOONCAKE = {"timestamp": 1000, "input_length": 600, "output_length": 5,
                 "hash_ids": [7, 8]}


@st.composite
def broken_rows(draw, good: dict, extra_keys: tuple[str, ...]) -> list[dict]:
    rows = [dict(good, **({"arrival_s": float(i)} if "arrival_s" in good else
                          {"timestamp": 1000 * i})) for i in range(draw(st.integers(1, 4)))]
    for _ in range(draw(st.integers(1, 3))):
        row = rows[draw(st.integers(0, len(rows) - 1))]
        key = draw(st.sampled_from(sorted(good) + list(extra_keys)))
        action = draw(st.sampled_from(["junk", "junk", "drop", "junk-in-list"]))
        if action == "drop":
            row.pop(key, None)
        elif action == "junk-in-list" and isinstance(row.get(key), list):
            row[key] = [*row[key][:-1], draw(SCALARS)]
        else:
            row[key] = draw(JUNK)
    return rows


def _write_lines(rows: list, name: str) -> Path:
    path = _workdir() / name
    # NaN and Infinity are written as JSON's unofficial literals, which json.loads reads
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@FUZZ
@given(rows=broken_rows(GOOD_ROW, ("colour",)))
def test_broken_jsonl_traces_fail_cleanly(rows):
    path = _write_lines(rows, "trace.jsonl")
    assert_clean(lambda: read_jsonl(path), path)


@FUZZ
@given(rows=broken_rows(GOOD_MOONCAKE, ()))
def test_broken_mooncake_traces_fail_cleanly(rows):
    path = _write_lines(rows, "mooncake.jsonl")
    assert_clean(lambda: read_mooncake(path), path)


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(st.binary(max_size=30), min_size=1, max_size=3))
def test_bytes_that_are_not_json_lines_fail_cleanly(lines):
    path = _workdir() / "noise.jsonl"
    path.write_bytes(b"\n".join(lines))
    assert_clean(lambda: read_jsonl(path), path)
    assert_clean(lambda: read_mooncake(path), path)


# --------------------------------------------------------------------------- Parquet traces
def _good_requests() -> dict[str, pa.Array]:
    return {"request_id": pa.array([0, 1], pa.int64()),
            "arrival_s": pa.array([0.0, 1.0], pa.float64()),
            "query_tokens": pa.array([5, 6], pa.int64()),
            "output_tokens": pa.array([2, 3], pa.int64()),
            "doc_ids": pa.array([[1, 2], [2]], pa.list_(pa.int64()))}


def _good_documents() -> dict[str, pa.Array]:
    return {"doc_id": pa.array([1, 2], pa.int64()), "tokens": pa.array([10, 20], pa.int64())}


# columns of two rows with the wrong type or out-of-range values
BAD_COLUMNS = st.sampled_from([
    pa.array([-1, 2**62], pa.int64()),
    pa.array([2**63, 2**64 - 1], pa.uint64()),
    pa.array([3, None], pa.int64()),
    pa.array([float("nan"), float("inf")], pa.float64()),
    pa.array([-0.5, 1e308], pa.float64()),
    pa.array(["a", "b"]),
    pa.array([True, False]),
    pa.array([None, None], pa.null()),
    pa.array([[1, None], [2]], pa.list_(pa.int64())),
    pa.array([[2**64 - 1], [1]], pa.list_(pa.uint64())),
    pa.array([[1.5], [2.0]], pa.list_(pa.float64())),
    pa.array([[], [99]], pa.list_(pa.int64())),
    pa.array([[[1], [2, 9]], None], pa.list_(pa.list_(pa.int64()))),
    pa.array([[0.1, -1.0], [float("nan")]], pa.list_(pa.float64())),
    pa.array([2**31, 2**40], pa.int64()),
])
REQUEST_COLUMNS = ("request_id", "arrival_s", "query_tokens", "output_tokens", "doc_ids",
                   "stages", "stage_times_s", "query_text", "has_history", "colour")
DOCUMENT_COLUMNS = ("doc_id", "tokens", "text", "colour")


@st.composite
def broken_tables(draw) -> tuple[dict, dict, bytes]:
    requests, documents = _good_requests(), _good_documents()
    for _ in range(draw(st.integers(1, 3))):
        table = draw(st.sampled_from([requests, documents]))
        names = REQUEST_COLUMNS if table is requests else DOCUMENT_COLUMNS
        name = draw(st.sampled_from(names))
        if draw(st.integers(0, 3)) == 0:
            table.pop(name, None)
        else:
            table[name] = draw(BAD_COLUMNS)
    version = draw(st.sampled_from([b"1", b"1", b"1", b"2", b"x"]))
    return requests, documents, version


@FUZZ
@given(tables=broken_tables())
def test_broken_parquet_traces_fail_cleanly(tables):
    requests, documents, version = tables
    folder = _workdir() / "trace"
    folder.mkdir()
    for name, columns in (("requests.parquet", requests), ("documents.parquet", documents)):
        table = pa.table(columns) if columns else pa.table({"x": pa.array([1])}).drop(["x"])
        pq.write_table(table.replace_schema_metadata({VERSION_KEY: version}), folder / name)
    assert_clean(lambda: read_trace(folder), folder)


# --------------------------------------------------------------------------- profiles
GOOD_PROFILE = load_profile("a10g-mistral-7b").to_dict()


def _paths(data: object, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a JSON document (list items by index, the first two of each list)."""
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:2]):
            found += _paths(value, (*prefix, i))
    return found


def _leaf(path: tuple):
    value = GOOD_PROFILE
    for key in path:
        value = value[key]
    return value


PROFILE_PATHS = [p for p in _paths(GOOD_PROFILE) if p[0] != "obtained"]
# numbers are where a broken profile does damage: drawn more often, and often out of range
NUMBER_PATHS = [p for p in PROFILE_PATHS if isinstance(_leaf(p), int | float)]
PROFILE_CHANGES = st.tuples(
    st.one_of(st.sampled_from(NUMBER_PATHS), st.sampled_from(PROFILE_PATHS)), st.booleans(),
    st.one_of(BIG, st.sampled_from([0, -1, 0.0, 1.5, "8", True, None]), JUNK))


@FUZZ
@given(changes=st.lists(PROFILE_CHANGES, min_size=1, max_size=3))
@example(changes=[(("kv_capacity_bytes",), False, 0)])  # found by this test: no room for KV
def test_broken_profiles_fail_cleanly(changes):
    data = copy.deepcopy(GOOD_PROFILE)
    for path, drop, value in changes:
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            if drop and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed or replaced this path's parent
    file = _workdir() / "profile.json"
    file.write_text(json.dumps(data))
    profile = assert_clean(lambda: load_profile(str(file)), file)
    if isinstance(profile, Profile):  # what loads must size KV and price an iteration
        kv = profile.model.kv_bytes_per_token
        assert isinstance(kv, int) and not isinstance(kv, bool) and 0 < kv < 2**40, kv
        assert 0 < profile.kv_capacity_bytes < 2**63
        assert math.isfinite(profile.prefill.at(100, 200))
        assert math.isfinite(profile.decode.at(4, 300))
        assert math.isfinite(profile.transfers.host_to_device_s(10**6))


@settings(max_examples=30, deadline=None)
@given(raw=st.binary(max_size=40))
def test_bytes_that_are_not_a_profile_fail_cleanly(raw):
    file = _workdir() / "profile.json"
    file.write_bytes(raw)
    assert_clean(lambda: load_profile(str(file)), file)


# --------------------------------------------------------------------------- configurations
CONFIG_FIELDS = [f for f in SimConfig.__dataclass_fields__]
TOML_JUNK = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.text(max_size=6), st.lists(st.integers(-3, 3), max_size=3),
    st.lists(st.text(max_size=2), max_size=2), st.sampled_from(["1GiB", "-1GiB", "abc", ""]))


@FUZZ
@given(values=st.dictionaries(st.sampled_from([*CONFIG_FIELDS, "colour"]), TOML_JUNK,
                              min_size=1, max_size=4),
       header=st.sampled_from([{}, {"format": "ragsim.config", "version": 1},
                               {"format": "other"}, {"version": 7}]))
def test_broken_configs_fail_cleanly(values, header):
    file = _workdir() / "config.toml"
    file.write_text(tomli_w.dumps({**header, "run": values}))

    def read() -> SimConfig:
        return build_config({}, base=load_config_file(file), source=str(file))

    assert_clean(read, file)


@settings(max_examples=30, deadline=None)
@given(raw=st.binary(max_size=40))
def test_bytes_that_are_not_toml_fail_cleanly(raw):
    file = _workdir() / "config.toml"
    file.write_bytes(raw)
    assert_clean(lambda: build_config({}, base=load_config_file(file), source=str(file)), file)


# --------------------------------------------------------------------------- pinned cases
PAST_64_BITS = 2**64 + 1
HUGE = 10**400  # past a float's range too


@pytest.mark.parametrize("reader,good,field,value", [
    (read_jsonl, GOOD_ROW, "query_tokens", PAST_64_BITS),
    (read_jsonl, GOOD_ROW, "output_tokens", 2**40),  # an absurd answer length
    (read_jsonl, GOOD_ROW, "doc_ids", [1, PAST_64_BITS]),
    (read_jsonl, GOOD_ROW, "doc_tokens", [100, PAST_64_BITS]),
    (read_jsonl, GOOD_ROW, "arrival_s", HUGE),
    (read_jsonl, GOOD_ROW, "arrival_s", float("inf")),
    (read_jsonl, GOOD_ROW, "arrival_s", float("nan")),
    (read_mooncake, GOOD_MOONCAKE, "timestamp", HUGE),
    (read_mooncake, GOOD_MOONCAKE, "timestamp", float("inf")),
    (read_mooncake, GOOD_MOONCAKE, "input_length", PAST_64_BITS),
    (read_mooncake, GOOD_MOONCAKE, "output_length", -1),
    (read_mooncake, GOOD_MOONCAKE, "hash_ids", [7, PAST_64_BITS]),
    (read_mooncake, GOOD_MOONCAKE, "hash_ids", [-7, 8]),
])
def test_out_of_range_integers_name_file_row_and_field(reader, good, field, value):
    """Integers past 64 bits ended in an OverflowError traceback (exit 1) when the trace was
    built; absurd or negative values must be refused where they are read, too."""
    path = _write_lines([good, {**good, field: value}], "t.jsonl")
    with pytest.raises(RagsimInputError) as info:
        reader(path)
    assert (info.value.file, info.value.row, info.value.field) == (str(path), 2, field)


@pytest.mark.parametrize("table,column,values,shown", [
    ("requests", "arrival_s", pa.array([0.0, float("inf")]), "inf"),
    ("requests", "arrival_s", pa.array([0.0, float("nan")]), "nan"),
    ("requests", "query_tokens", pa.array([5, 2**63 + 1], pa.uint64()), str(2**63 + 1)),
    ("requests", "output_tokens", pa.array([5, 2**40], pa.int64()), str(2**40)),
    ("requests", "doc_ids", pa.array([[1], [2**63 + 1]], pa.list_(pa.uint64())),
     str(2**63 + 1)),
    ("documents", "tokens", pa.array([10, 2**40], pa.int64()), str(2**40)),
])
def test_parquet_values_out_of_range_name_file_row_and_field(table, column, values, shown):
    """Named where they are, and shown as written (a uint64 past int64's range used to wrap
    to a negative number, and the error quoted that)."""
    requests, documents = _good_requests(), _good_documents()
    (requests if table == "requests" else documents)[column] = values
    folder = _workdir() / "trace"
    folder.mkdir()
    for name, columns in (("requests.parquet", requests), ("documents.parquet", documents)):
        pq.write_table(pa.table(columns).replace_schema_metadata({VERSION_KEY: b"1"}),
                       folder / name)
    with pytest.raises(RagsimInputError) as info:
        read_trace(folder)
    assert (info.value.file, info.value.row, info.value.field) == (
        str(folder / f"{table}.parquet"), 1, column)
    assert shown in info.value.detail


@pytest.mark.parametrize("path,value", [
    (("kv_capacity_bytes",), HUGE),  # OverflowError
    (("kv_capacity_bytes",), 2**63),  # loaded, then past the tree's 64-bit byte counts
    (("transfers", "host_to_device_bytes_per_s"), HUGE),
    (("prefill", "cached_tokens", 1), HUGE),  # OverflowError inside the grid's checks
    (("model", "num_layers"), "32"),  # loaded: KV per token was the string "32" repeated
    (("model", "head_dim"), -128),  # loaded: negative KV per token
    (("model", "dtype"), "fp12"),
])
def test_profile_values_out_of_range_name_the_field(path, value):
    data = copy.deepcopy(GOOD_PROFILE)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    file = _workdir() / "profile.json"
    file.write_text(json.dumps(data))
    with pytest.raises(RagsimInputError) as info:
        load_profile(str(file))
    assert info.value.file == str(file)
    assert info.value.field in (".".join(str(k) for k in path[:2]), path[0])


@pytest.mark.parametrize("run,field", [
    ({"system": 0}, "system"),  # named no file
    ({"system": ["ragcache"]}, "system"),  # TypeError: unhashable list
    ({"host_cache_bytes": []}, "host_cache_bytes"),  # TypeError inside parse_bytes
    ({"host_cache_bytes": float("nan")}, "host_cache_bytes"),  # ValueError from round(nan)
    ({"gpu_kv_bytes": "9" * 400 + "GiB"}, "gpu_kv_bytes"),  # OverflowError
    ({"gpu_kv_bytes": "lots"}, "gpu_kv_bytes"),  # named no file
])
def test_config_values_name_the_file_and_field(run, field):
    file = _workdir() / "config.toml"
    file.write_text(tomli_w.dumps({"run": run}))
    with pytest.raises(RagsimInputError) as info:
        build_config({}, base=load_config_file(file), source=str(file))
    assert (info.value.file, info.value.field) == (str(file), field)


def test_a_mooncake_file_read_as_a_trace_says_how_to_import_it():
    path = _write_lines([GOOD_MOONCAKE], "mooncake.jsonl")
    with pytest.raises(RagsimInputError, match="import-mooncake") as info:
        read_jsonl(path)
    assert (info.value.file, info.value.row) == (str(path), 1)
