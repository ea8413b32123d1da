"""Turning passages into the documents a trace retrieves.

Document size drives everything a KV cache saves, so it must be chosen to match the study:

* ``passage``: one document per passage (title line + text), as the corpus has them;
* ``window``: fixed windows of ``window_tokens`` with ``overlap_tokens`` shared between
  neighbours (the usual RAG chunker; makes documents smaller and equal);
* ``pack``: consecutive passages joined until the next would pass ``window_tokens`` (makes short
  passages into long documents, e.g. the paper's long Wikipedia passages from lead summaries;
  a passage longer than the window stays whole).

Token counts come from the tokenizer, counted on the document text as it would enter a prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ragsim.errors import RagsimInputError
from ragsim.traces.corpus.sources import Corpus
from ragsim.traces.corpus.tokenizers import Tokenizer

CHUNKING_MODES = ("passage", "window", "pack")


@dataclass(frozen=True)
class Chunking:
    mode: str = "passage"
    window_tokens: int = 256
    overlap_tokens: int = 32

    def validate(self) -> None:
        if self.mode not in CHUNKING_MODES:
            raise RagsimInputError(f"unknown chunking {self.mode!r}; choose one of "
                                   f"{', '.join(CHUNKING_MODES)}", field="--chunking")
        if self.window_tokens < 1:
            raise RagsimInputError("must be >= 1", field="--window-tokens")
        if not 0 <= self.overlap_tokens < self.window_tokens:
            raise RagsimInputError(f"must lie in [0, window_tokens={self.window_tokens})",
                                   field="--overlap-tokens")


@dataclass
class Documents:
    """The documents of a build, in id order (``doc_id`` = position)."""

    texts: list[str]
    tokens: np.ndarray  # int64
    passage_ids: list[list[str]]  # the corpus passages each document came from
    start_token: np.ndarray  # int64: where a window starts inside its passage (0 otherwise)

    def __len__(self) -> int:
        return len(self.texts)


def passage_text(corpus: Corpus, i: int) -> str:
    title = corpus.titles[i]
    return f"{title}\n{corpus.texts[i]}" if title else corpus.texts[i]


def make_documents(corpus: Corpus, tokenizer: Tokenizer, chunking: Chunking,
                   progress: Callable[[int], None] | None = None) -> Documents:
    chunking.validate()
    texts: list[str] = []
    tokens: list[int] = []
    sources: list[list[str]] = []
    starts: list[int] = []
    pack_text: list[str] = []
    pack_ids: list[str] = []
    pack_tokens = 0
    separator = "\n\n"

    def flush_pack() -> None:
        nonlocal pack_tokens
        if pack_text:
            text = separator.join(pack_text)
            texts.append(text)
            tokens.append(len(tokenizer.encode(text)))
            sources.append(list(pack_ids))
            starts.append(0)
            pack_text.clear()
            pack_ids.clear()
            pack_tokens = 0

    step = chunking.window_tokens - chunking.overlap_tokens
    for i, passage_id in enumerate(corpus.ids):
        text = passage_text(corpus, i)
        ids = tokenizer.encode(text)
        if chunking.mode == "passage":
            texts.append(text)
            tokens.append(len(ids))
            sources.append([passage_id])
            starts.append(0)
        elif chunking.mode == "window":
            start = 0
            while True:
                window = ids[start:start + chunking.window_tokens]
                texts.append(tokenizer.decode(window))
                tokens.append(len(window))
                sources.append([passage_id])
                starts.append(start)
                if start + chunking.window_tokens >= len(ids):
                    break
                start += step
        else:  # pack; joining adds a few separator tokens, counted when the pack is encoded
            if pack_text and pack_tokens + len(ids) > chunking.window_tokens:
                flush_pack()
            pack_text.append(text)
            pack_ids.append(passage_id)
            pack_tokens += len(ids)
        if progress is not None:
            progress(1)
    flush_pack()
    return Documents(texts=texts, tokens=np.asarray(tokens, dtype=np.int64),
                     passage_ids=sources, start_token=np.asarray(starts, dtype=np.int64))
