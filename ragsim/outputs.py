"""Where results go: never over an input, never silently over an earlier result, always as one set.

A run's folder holds ``requests.parquet``, ``summary.json`` and ``config.toml``; a trace's folder
``requests.parquet`` and ``documents.parquet``. The two share a file name, so a careless ``--out``
can replace a trace with a run's records, or a run's records with a trace. Before any long work
starts, :func:`claim_output_dir` refuses a folder

* that would overwrite one of the job's own inputs (``run --trace DIR --out DIR``), whatever
  ``--force`` says: the job would destroy what it reads;
* that holds an earlier result (a run's or a trace's files), unless the user says ``--force``:
  an interrupted run must not replace a complete 200k-request result with a 34k partial one.

The files of one result carry one *set id* (Parquet metadata, a JSON field, a TOML comment),
written last by the summary, so that a reader can tell a complete set from new records beside an
old summary (a SIGKILL between two renames): :func:`check_result_set`.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ragsim.api.options import label_on
from ragsim.atomic import write_atomically, write_text_atomically
from ragsim.errors import RagsimInputError

RUN_FILES = ("requests.parquet", "summary.json", "config.toml")
TRACE_FILES = ("requests.parquet", "documents.parquet")
SET_ID_KEY = b"ragsim.set_id"
SET_ID_FIELD = "set_id"
_TOML_MARK = "# ragsim result set "


def new_set_id() -> str:
    """A fresh id for one result's files (not part of what is simulated: no seed draws it)."""
    return secrets.token_hex(8)


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """Make sure results can be written to the folder ``path`` *before* a long job starts (an
    unusable --out found after an hour's simulation costs the hour): it is a folder or can be
    made one, and a file can be written there (one is, and removed, in ``path`` or in the
    nearest folder above it that exists). Nothing is left behind: a job refused for another
    reason must not leave an empty folder."""
    if path.exists() and not path.is_dir():
        raise RagsimInputError("is a file; give a folder (it is created if missing)",
                               file=str(path), field=flag)
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise RagsimInputError(f"cannot create the folder: {existing} is a file",
                               file=str(path), field=flag)
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise RagsimInputError(f"cannot write results here: {exc.strerror or exc}",
                               file=str(path), field=flag) from None


def check_out_file(path: Path, flag: str = "--out") -> None:
    """``check_out_dir`` for a single output file: its folder is usable and it is no folder."""
    if path.is_dir():
        raise RagsimInputError("is a folder; give a file name", file=str(path), field=flag)
    check_out_dir(path.parent if str(path.parent) else Path("."), flag)


def claim_output_file(path: Path, *, force: bool = False, flag: str = "--out") -> None:
    """``check_out_file``, and refuse a file that is already there (an earlier result: a
    profile measured for an hour) unless ``force``. Called before the work, so that a refusal
    costs nothing; a job's own partial state beside it (``OUT.partial.json``) is not the
    result and does not count."""
    check_out_file(path, flag)
    if path.exists() and not force:
        raise RagsimInputError(f"holds an earlier result; give another file, or "
                               f"{label_on('force')} to replace it", file=str(path),
                               field=flag)


def _files_of(inputs: Iterable[str | os.PathLike | None]) -> set[Path]:
    """The real paths of the files the inputs name (a folder: the files directly in it)."""
    found: set[Path] = set()
    for given in inputs:
        if given is None or str(given) == "":
            continue
        path = Path(os.path.realpath(given))
        if path.is_dir():
            found.update(p for p in path.iterdir() if p.is_file())
        elif path.exists():
            found.add(path)
    return found


def claim_output_dir(path: Path, *, writes: Iterable[str], inputs: Iterable = (),
                     force: bool = False, flag: str = "--out") -> None:
    """Refuse ``path`` as a job's output folder if writing ``writes`` (file names) there would
    replace one of the job's ``inputs`` (files or folders; always refused), or a file that is
    already there (an earlier result; allowed with ``force``). Then check it can be written.
    Called before the work, so that a refusal costs nothing."""
    check_out_dir(path, flag)
    folder = Path(os.path.realpath(path))
    targets = {folder / name for name in writes}
    clobbered = sorted(str(p.name) for p in targets & _files_of(inputs))
    if clobbered:
        raise RagsimInputError(f"holds this job's own input ({', '.join(clobbered)}), which the "
                               "results would replace; give another folder",
                               file=str(path), field=flag)
    earlier = sorted(p.name for p in targets if p.exists())
    if earlier and not force:
        raise RagsimInputError(f"holds an earlier result ({', '.join(earlier)}); give another "
                               f"folder, or {label_on('force')} to replace it", file=str(path),
                               field=flag)


def save_run_result(out_dir: Path, records, summary: dict, config_toml: str | None = None,
                    *, flag: str = "--out") -> str:
    """:func:`write_run_result`, with a full disk said in one line: nothing of the result was
    kept there (the summary, which marks a set complete, is written last)."""
    try:
        return write_run_result(out_dir, records, summary, config_toml)
    except OSError as exc:
        raise RagsimInputError(f"the results could not be written ({exc.strerror or exc}); "
                               "nothing of this run was kept there", file=str(out_dir),
                               field=flag) from None


def write_run_result(out_dir: Path, records, summary: dict, config_toml: str | None = None
                     ) -> str:
    """A run's or replay's files as one set: records (Parquet, the set id in its metadata),
    ``config.toml`` (its first line names the set) and, last, ``summary.json`` (with the set id):
    the summary is what says the set is complete. An earlier set's summary goes first, so an
    interrupted write never leaves an old summary beside new records. Returns the set id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    set_id = new_set_id()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").unlink(missing_ok=True)
    table = pa.Table.from_pandas(records, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           SET_ID_KEY: set_id.encode()})
    written: list[Path] = []
    try:
        write_atomically(out_dir / "requests.parquet", lambda tmp: pq.write_table(table, tmp))
        written.append(out_dir / "requests.parquet")
        if config_toml is not None:
            write_text_atomically(out_dir / "config.toml",
                                  f"{_TOML_MARK}{set_id}\n{config_toml}")
            written.append(out_dir / "config.toml")
        else:
            (out_dir / "config.toml").unlink(missing_ok=True)  # no earlier set's config
        write_text_atomically(out_dir / "summary.json",
                              json.dumps({**summary, SET_ID_FIELD: set_id}, indent=2,
                                         default=str) + "\n")
    except OSError:
        # a set a full disk cut short leaves none of its files: half a result is no result,
        # and the space it held may be what the user needs to write it again (an interrupt
        # leaves them, marked unfinished by the missing summary: check_result_set)
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return set_id


def _parquet_set_id(path: Path) -> str | None:
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as exc:
        raise RagsimInputError(f"not a readable Parquet file ({exc})", file=str(path)) from None
    value = metadata.get(SET_ID_KEY)
    return value.decode() if value is not None else None


def _toml_set_id(path: Path) -> str | None:
    with open(path, encoding="utf-8", errors="replace") as handle:
        first = handle.readline().strip()
    return first[len(_TOML_MARK):].strip() if first.startswith(_TOML_MARK.strip()) else None


def check_result_set(out_dir: Path, summary: dict | None = None) -> None:
    """A run folder's files belong to one result: records without a summary are an unfinished
    write, and records or a config from another set than the summary are a mismatch (a write
    cut between two renames). Results written before set ids existed carry none and pass."""
    records = out_dir / "requests.parquet"
    summary_file = out_dir / "summary.json"
    if not summary_file.exists():
        if records.exists() and _parquet_set_id(records) is not None:
            raise RagsimInputError("holds records but no summary.json: the run that wrote them "
                                   "was stopped before it finished writing; run it again",
                                   file=str(out_dir))
        return
    if summary is None:
        try:
            summary = json.loads(summary_file.read_text())
        except (OSError, ValueError) as exc:
            raise RagsimInputError(f"not readable JSON ({exc})", file=str(summary_file)) from None
    if not isinstance(summary, dict):
        raise RagsimInputError("is not a JSON object", file=str(summary_file))
    expected = summary.get(SET_ID_FIELD)
    if expected is None:
        return
    for path, read in ((records, _parquet_set_id), (out_dir / "config.toml", _toml_set_id)):
        if path.exists():
            found = read(path)
            if found != expected:
                raise RagsimInputError(
                    f"belongs to another result than summary.json (set {found or 'unmarked'}, "
                    f"summary's {expected}): a write was cut short; run it again",
                    file=str(path))
