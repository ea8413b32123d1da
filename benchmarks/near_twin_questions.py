"""Build the held-out near-twin golden set: distinct questions about Python standard-library
functions whose names differ by a letter or a word ("What does os.execlpe do in Python?" vs
"... os.execle ..."), each answered by the first line of its own docstring, plus one templated
paraphrase of every other question.

    python benchmarks/near_twin_questions.py --out tests/data

writes ``answer_near_twins.jsonl`` (``question``, ``answer``) and
``answer_near_twins_paraphrases.jsonl`` (``question``: the paraphrase, ``rephrases``: the
question it rephrases, verbatim). Functions come in families (os.exec*, os.spawn*, math.log*,
shutil.copy*, itertools, operator, statistics.median_*, ...) so most questions have a twin one
or two characters away; a function whose docstring line is not unique, or is empty, is left
out. Docstrings are those of the Python that runs the script (the shipped files: 3.11). The
paraphrases are templates, not human rewrites; every one keeps the function's name (a
paraphrase that drops it would ask about something else).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from pathlib import Path

MODULES = ("os", "os.path", "math", "shutil", "itertools", "operator", "statistics", "random",
           "heapq", "bisect", "time", "string", "functools", "glob", "fnmatch", "cmath",
           "textwrap", "base64", "binascii", "zlib")
QUESTION = "What does {name} do in Python?"
PARAPHRASES = (
    "In Python, what is {name} used for?",
    "Explain what {name} does.",
    "What is the purpose of Python's {name}?",
    "Can you tell me what {name} does in Python?",
    "What's {name} for, in Python?",
    "Describe what the Python function {name} does.",
    "What happens when I call {name} in Python?",
    "What is {name} in the Python standard library?",
)


def functions(limit: int) -> list[tuple[str, str]]:
    """(qualified name, first docstring line) of public functions, module by module."""
    found: list[tuple[str, str]] = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not callable(obj) or inspect.isclass(obj):
                continue
            doc = (inspect.getdoc(obj) or "").strip().splitlines()
            line = next((d.strip() for d in doc if d.strip() and "(" not in d[:len(name) + 1]),
                        "")
            if len(line) >= 12:
                found.append((f"{module_name}.{name}", line))
    by_answer: dict[str, int] = {}
    for _, line in found:
        by_answer[line] = by_answer.get(line, 0) + 1
    unique = [(n, a) for n, a in found if by_answer[a] == 1]
    return unique[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data"))
    parser.add_argument("--questions", type=int, default=400)
    args = parser.parse_args()
    rows = functions(args.questions)
    questions = [{"question": QUESTION.format(name=n), "answer": a} for n, a in rows]
    paraphrases = [{"question": PARAPHRASES[(i // 2) % len(PARAPHRASES)].format(name=n),
                    "rephrases": QUESTION.format(name=n)}
                   for i, (n, _) in enumerate(rows) if i % 2 == 0]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, items in (("answer_near_twins.jsonl", questions),
                        ("answer_near_twins_paraphrases.jsonl", paraphrases)):
        (args.out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                                             for r in items))
    print(f"{len(questions)} questions, {len(paraphrases)} paraphrases -> {args.out}")


if __name__ == "__main__":
    main()
