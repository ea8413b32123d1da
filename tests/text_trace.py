"""A small trace built with its text (``trace build`` on passages and questions written here,
no corpus package): for the tests that search its staged faiss index for real in a real run,
on the torch engine and on vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ("river", "mountain", "engine", "kernel", "castle", "violin", "harbor", "comet",
         "library", "orchard", "glacier", "market", "lantern", "compass", "meadow", "signal")


def _sentence(rng: np.random.Generator, n: int) -> str:
    return " ".join(str(w) for w in rng.choice(WORDS, size=n)).capitalize() + "."


def build_text_trace(folder: Path, *, passages: int = 30, questions: int = 8,
                     requests: int = 16, seed: int = 3, output_tokens: int = 3) -> Path:
    """Write the corpus and questions as JSON lines under ``folder`` and build a trace of
    ``requests`` requests from them (IVF, 4 lists all probed in 2 stages, top 2,
    ``output_tokens`` output tokens each); the embeddings are cached where the real run's
    search looks for them (the caller points ``XDG_CACHE_HOME`` into ``folder``)."""
    from ragsim.traces.corpus import BuildOptions, IndexSpec, build_trace, write_build
    from ragsim.traces.corpus.embedding import default_cache_dir

    rng = np.random.default_rng(seed)
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": f"Passage {i}", "text": " ".join(
        _sentence(rng, int(rng.integers(8, 20))) for _ in range(int(rng.integers(3, 9))))}) + "\n"
        for i in range(passages)), encoding="utf-8")
    asked = folder / "questions.jsonl"
    asked.write_text("".join(json.dumps({"text": _sentence(rng, 6)[:-1] + "?", "answer": "x"})
                             + "\n" for _ in range(questions)), encoding="utf-8")
    options = BuildOptions(corpus=str(corpus), questions=str(asked), top_k=2,
                           index=IndexSpec(kind="ivf", nlist=4, nprobe=4, stages=2),
                           cache_dir=default_cache_dir(), requests=requests,
                           sampling="uniform", seed=seed, output_tokens=str(output_tokens))
    return write_build(build_trace(options), folder / "built")


def text_trace_dir(tmp_path_factory, requests: int = 16, output_tokens: int = 3):
    """A fixture's body: ``build_text_trace`` of ``requests`` requests in a fresh folder, with
    ``XDG_CACHE_HOME`` there (the build's embeddings are the real search's) until the fixture
    ends."""
    import pytest

    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("text_trace")
        patch.setenv("XDG_CACHE_HOME", str(folder / "cache"))
        yield build_text_trace(folder, requests=requests, output_tokens=output_tokens)
