"""Query normalisation and the exact-match key.

Two requests share an exact-match entry when their *normalised* text is equal: Unicode NFKC,
case folded, surrounding whitespace stripped and inner runs of whitespace collapsed to one space.
Punctuation is kept (a trailing "?" is removed only when it is the last character, since "what is
x?" and "what is x" ask the same thing while inner punctuation can change meaning). The key is
``exact:{md5 hex of the UTF-8 normalised text}``, the article's L2 key, used for L1 too.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

_SPACES = re.compile(r"\s+")
# a namespace's (or tenant's) name: no ":" (it separates the parts of a key) and no glob
# character (a SCAN pattern over a namespace's prefix matches nothing else)
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAME_RULE = "1-64 letters, digits, '_', '.' or '-'"


def valid_name(name: object) -> bool:
    return isinstance(name, str) and NAME.fullmatch(name) is not None


def normalize_query(query: str) -> str:
    text = _SPACES.sub(" ", unicodedata.normalize("NFKC", query).casefold()).strip()
    return text[:-1].rstrip() if text.endswith(("?", "？")) else text


def exact_key(query: str, tenant: str | None = None) -> str:
    """The exact-match key of a raw query (normalised here); a tenant's queries have keys of
    their own (``exact:{tenant}/{md5}``), so an instance's L1, shared by every tenant it
    serves, never gives one tenant another's answer."""
    digest = hashlib.md5(normalize_query(query).encode("utf-8")).hexdigest()
    return f"exact:{digest}" if tenant is None else f"exact:{tenant}/{digest}"


def tenant_name(label: str) -> str:
    """A tenant's name from any label (a session id, a user id): the label itself when it is a
    valid name, else a stable digest of it."""
    return label if valid_name(label) else "t" + hashlib.md5(label.encode()).hexdigest()[:16]
