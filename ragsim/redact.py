"""Secrets never leave ragsim: a URL's password masked wherever it is printed, raised or written.

One helper for every place a server URL is shown (``answers golden`` / ``bench``, ``profile
--answer-cache``, ``run --backend torch``, the recorded configuration, error messages). A
password can sit in a URL's user information (``redis://user:PASSWORD@host``, or a lone
``redis://PASSWORD@host``, which some clients read as the password) or in its query
(``?password=PASSWORD``, which redis-py accepts); it may be percent-encoded. ``redact_url``
masks all of them without parsing the URL strictly (a malformed URL is the likeliest to reach
an error message); ``redact`` removes every form of a URL's secrets from any text (an
exception's message, a log line) — the URL itself, masked, may stay.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
_QUERY_SECRET = re.compile(r"([?&;](?:password|pass|pwd|auth|token)=)([^&;#]*)", re.IGNORECASE)


def _userinfo_span(url: str) -> tuple[int, int] | None:
    """Where a URL's user information lies: after ``scheme://``, up to its last ``@`` before
    the query (a password may hold ``@`` or ``/`` when not percent-encoded)."""
    start = url.find("://")
    if start < 0:
        return None
    start += 3
    end = url.find("?", start)
    at = url.rfind("@", start, end if end >= 0 else len(url))
    return (start, at) if at >= 0 else None


def secrets_of(url: str) -> list[str]:
    """The secret strings of ``url`` (its password, raw and decoded; query secrets)."""
    found = []
    span = _userinfo_span(url)
    if span is not None:
        info = url[span[0]:span[1]]
        found.append(info.partition(":")[2] if ":" in info else info)
    found += [m.group(2) for m in _QUERY_SECRET.finditer(url)]
    found = [s for s in found if s]
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


def redact_url(url: str) -> str:
    """``url`` with every password replaced by ``***`` (the user name kept)."""
    if not url:
        return url
    span = _userinfo_span(url)
    if span is not None:
        info = url[span[0]:span[1]]
        user = info.partition(":")[0] + ":" if ":" in info else ""
        if info:
            url = url[:span[0]] + user + MASK + url[span[1]:]
    return _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, url)


def redact(text: str, *urls: str | None) -> str:
    """``text`` with each URL shown masked and no trace of its secrets left."""
    for url in urls:
        if not url:
            continue
        text = text.replace(url, redact_url(url))
        for secret in secrets_of(url):
            text = text.replace(secret, MASK)
    return text


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def redact_urls(text: str) -> str:
    """``text`` with the secrets of every URL in it masked, for messages that echo what a user
    typed: a mistyped option (``--set redis://:PW@host``, no ``=``) can put a URL where no
    field says one is."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
