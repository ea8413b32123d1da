"""The semantic tier's false-hit guard: two close questions must ask about the same things.

Cosine similarity alone cannot tell "What does os.execle do?" from "What does os.execlpe do?"
(all-MiniLM-L6-v2 puts such pairs at 0.93-0.99), so a semantic hit also has to pass a check on
the questions' *entities*: the tokens that name what is asked about — dotted or underscored
identifiers (``os.execlpe``, ``log1p``, ``max_workers``), tokens with a digit (numbers,
``sha256``), and capitalised words that are not common English words (``France``, ``Python``).
The hit is refused when each question names an entity the other does not (one thing
*substituted* for another: another function, another number, another country); an entity only
one side has (``... in Python?`` vs ``Explain os.execlpe.``) is context, not a different
question. Measured on a held-out set of near-twin questions (docs/answer_cache.md).

What it cannot see: two questions that differ only in a common word ("boiling" vs "freezing
point of water"); those stay the threshold's job.
"""

from __future__ import annotations

import re
import unicodedata

GUARDS = ("entities", "none")

_TOKEN = re.compile(r"[^\W_](?:[\w'’+#-]*[\w+#])?(?:\.[^\W\d_][\w]*)*|_\w+", re.UNICODE)
# common words that may be capitalised (a sentence's start, a polite or templated opening)
_COMMON = frozenset(re.findall(r"\S+", """
a about after all also an and any are as at be been before being but by can could describe
did do does doing explain for from give had has have how i i'd i'm if in into is it its just
know let like me my need of on or please question quick say show so some tell than that the
their them then there these they this to under was we were what what's whats when where which
while who whom whose why will with would you your
"""))


def _is_entity(token: str) -> bool:
    if any(c.isdigit() for c in token) or "." in token or "_" in token:
        return True
    return token[0].isupper() and token.casefold() not in _COMMON


def entities(query: str) -> frozenset[str]:
    """The entity tokens of ``query`` (case-folded)."""
    text = unicodedata.normalize("NFKC", query)
    return frozenset(t.casefold() for t in _TOKEN.findall(text) if _is_entity(t))


def same_entities(asked: str, stored: str) -> bool:
    """False when each question names an entity the other does not (a substitution)."""
    a, b = entities(asked), entities(stored)
    return not (a - b and b - a)


def passes(guard: str, asked: str, stored: str) -> bool:
    """Whether a semantic hit of ``asked`` on the entry stored for ``stored`` is served."""
    if guard == "none":
        return True
    if guard == "entities":
        return same_entities(asked, stored)
    raise ValueError(f"answer cache guard {guard!r} is not one of {', '.join(GUARDS)}")
