"""Hot-key admission: only the N most requested keys of a sliding time window are cached.

The article's guard against filling the cache with one-off questions. Each lookup records its
key at its time; a key is *hot* when fewer than N other keys in the window (the last
``window_s`` seconds, ``(now - window_s, now]``) were requested more often than it, ties broken
by the key itself (so the admitted set never exceeds N and does not depend on dict order).
"""

from __future__ import annotations

from collections import Counter, deque


class HotKeys:
    def __init__(self, top_n: int, window_s: float) -> None:
        if top_n < 1 or window_s <= 0:
            raise ValueError("hot keys need top_n >= 1 and window_s > 0")
        self.top_n, self.window_s = top_n, window_s
        self._seen: deque[tuple[float, str]] = deque()
        self._counts: Counter[str] = Counter()

    def _slide(self, now_s: float) -> None:
        seen, counts = self._seen, self._counts
        while seen and seen[0][0] <= now_s - self.window_s:
            _, key = seen.popleft()
            counts[key] -= 1
            if not counts[key]:
                del counts[key]

    def record(self, key: str, now_s: float) -> None:
        self._slide(now_s)
        self._seen.append((now_s, key))
        self._counts[key] += 1

    def is_hot(self, key: str, now_s: float) -> bool:
        self._slide(now_s)
        mine = self._counts.get(key, 0)
        if not mine:
            return False
        ahead = sum(1 for other, count in self._counts.items()
                    if count > mine or (count == mine and other < key))
        return ahead < self.top_n
