"""Which user callables run on the replica's event loop and which go to a worker thread."""

from __future__ import annotations

import functools

from kubeserve.runtime.replica.user_code import is_async_callable


async def coroutine_function() -> None: ...


def plain_function() -> None: ...


class AsyncCall:
    async def __call__(self) -> None: ...

    async def method(self) -> None: ...

    def sync_method(self) -> None: ...


class SyncCall:
    def __call__(self) -> None: ...


def test_async_callables_are_told_apart_from_blocking_ones() -> None:
    assert is_async_callable(coroutine_function)
    assert is_async_callable(AsyncCall())
    assert is_async_callable(AsyncCall().method)
    assert is_async_callable(functools.partial(coroutine_function))
    assert not is_async_callable(plain_function)
    assert not is_async_callable(SyncCall())
    assert not is_async_callable(AsyncCall().sync_method)
    assert not is_async_callable(functools.partial(plain_function))
