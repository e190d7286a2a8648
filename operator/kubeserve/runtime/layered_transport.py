"""A transport layered over a plain one: what the data plane's byte-transforming layers (the
authenticated channel's :mod:`~kubeserve.runtime.sealing`, the proxy's
:mod:`~kubeserve.runtime.tls_stream`) leave to the transport below.

A layer transforms what is written (``write``, ``writelines``, ``close``...); reading, flow
control and the socket's details are the plain transport's, whose ``pause_writing`` and
``resume_writing`` reach the protocol above unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LayeredTransport"]


class LayeredTransport(asyncio.Transport):
    """The part of a layered transport that is the plain transport ``_raw``'s."""

    __slots__ = ("_raw",)

    def __init__(self, raw: asyncio.Transport) -> None:
        super().__init__()
        self._raw = raw

    def can_write_eof(self) -> bool:
        return False  # a layer's stream ends with its own close, not a half-close

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._raw.get_extra_info(name, default)
