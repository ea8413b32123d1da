"""Turning passages into the documents a trace retrieves.

Document size drives everything a KV cache saves, so it must be chosen to match the study:

* ``passage``: one document per passage (title line + text), as the corpus has them;
* ``window``: windows of at most ``window_tokens`` with ``overlap_tokens`` shared between
  neighbours (the usual RAG chunker; makes documents smaller and equal). A window cut inside a
  word can re-encode to a token more than it was cut as; such a window is shortened until its
  text fits;
* ``pack``: consecutive passages joined (separators included) until the next would pass
  ``window_tokens`` (makes short passages into long documents, e.g. the paper's long Wikipedia
  passages from lead summaries; a passage longer than the window stays whole).

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
SEAM_TOKENS = 8  # at most this many tokens added where two packed passages join (see pack)


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
    pack_tokens = 0  # the sum of the packed passages' own counts
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
                end = min(start + chunking.window_tokens, len(ids))
                # a window cut inside a word re-encodes differently (a word piece without its
                # leading space): count the text as it enters a prompt, and shorten the window
                # until that count fits
                window_text = tokenizer.decode(ids[start:end])
                count = len(tokenizer.encode(window_text))
                while count > chunking.window_tokens and end - start > 1:
                    end -= 1
                    window_text = tokenizer.decode(ids[start:end])
                    count = len(tokenizer.encode(window_text))
                texts.append(window_text)
                tokens.append(count)
                sources.append([passage_id])
                starts.append(start)
                if end >= len(ids):
                    break
                # the next window repeats this one's last overlap_tokens
                start = max(start + 1, end - chunking.overlap_tokens)
        else:  # pack: the joined text (separators included) must fit the window
            if pack_text:
                # a seam adds a separator and may re-split the next word (mistral: 1-5 tokens
                # on Wikipedia, cl100k: 0-1); only near the window is the joined text encoded
                rough = pack_tokens + len(ids) + SEAM_TOKENS * len(pack_text)
                if rough > chunking.window_tokens and len(tokenizer.encode(
                        separator.join([*pack_text, text]))) > chunking.window_tokens:
                    flush_pack()
            pack_text.append(text)
            pack_ids.append(passage_id)
            pack_tokens += len(ids)
        if progress is not None:
            progress(1)
    flush_pack()
    return Documents(texts=texts, tokens=np.asarray(tokens, dtype=np.int64),
                     passage_ids=sources, start_token=np.asarray(starts, dtype=np.int64))
