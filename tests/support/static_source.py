"""An endpoint source that delivers one fixed snapshot: proxies and handle clients without a
controller, for tests of the data plane alone."""

from __future__ import annotations

from collections.abc import Callable

from kubeserve.runtime.wire import Snapshot


class StaticSource:
    """A :class:`~kubeserve.runtime.discovery.EndpointSource` of one ``snapshot``."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    async def start(self, on_update: Callable[[Snapshot], None]) -> None:
        on_update(self.snapshot)

    async def close(self) -> None:
        pass
