"""Which periodic resyncs of a settled application run a full pass (pure).

The operator resyncs every custom resource every 30 s (the safety net against a change no event
announced). A resync of a RUNNING application whose inputs are those of its last pass skips the
pass, except one resync in ``every``: the full pass that catches drift no input shows.

:class:`ResyncTurns` counts each application's resyncs, whatever passes events caused between
them, so each gets exactly one full pass in ``every`` resyncs; each starts at a phase of its own
(a hash of its key), so applications created together do not all take their full pass in the
same sweep.
"""

from __future__ import annotations

import zlib

__all__ = ["ResyncTurns"]


class ResyncTurns:
    """Per key: its resyncs so far, modulo ``every``."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.every = every
        self._turn: dict[str, int] = {}

    def full(self, key: str) -> bool:
        """Count a resync of ``key``: whether it is the one in ``every`` that runs in full."""
        turn = self._turn.get(key)
        if turn is None:
            turn = zlib.crc32(key.encode()) % self.every
        turn = self._turn[key] = (turn + 1) % self.every
        return turn == 0

    def forget(self, key: str) -> None:
        self._turn.pop(key, None)

    def __len__(self) -> int:
        return len(self._turn)
