"""``@batch``: callers pass one item each; the wrapped function receives lists of them.

Calls queue up until ``max_batch_size`` items (as measured by ``batch_size_fn``, default ``len``)
are waiting or ``batch_wait_timeout_s`` passed since the first of them, then the function runs once
with one list per argument and must return a list as long as the batch; each caller gets its own
element back (or the exception the function raised). At most ``max_concurrent_batches`` batches
run at once.

A method's queue belongs to its instance (stored on it), a function's to the function, so two
replicas' objects never share a batch. Queues are created on first use, on the running event loop.
The wrapped function may be ``async def`` or a plain function (run on the event loop, like every
sync method of a replica); callers always ``await`` the wrapper.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["BatchQueue", "batch"]

_QUEUE_ATTR = "_kubeserve_batch_queues"


class _Item:
    __slots__ = ("args", "future", "kwargs")

    def __init__(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], future: asyncio.Future[Any]
    ) -> None:
        self.args = args
        self.kwargs = kwargs
        self.future = future


class BatchQueue:
    """The waiting calls of one batched function (or of one instance's batched method)."""

    def __init__(self, settings: _Settings, fn: Callable[..., Any]) -> None:
        self.settings = settings
        self.fn = fn
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.slots = asyncio.Semaphore(settings.max_concurrent_batches)
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.running: set[asyncio.Task[None]] = set()

    def put(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Item(args, kwargs, future))
        return future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + self.settings.batch_wait_timeout_s
            while self._size(batch) < self.settings.max_batch_size:
                if not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), remaining))
                except TimeoutError:
                    break
            await self.slots.acquire()
            task = loop.create_task(self._process(batch))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    def _size(self, batch: list[_Item]) -> int:
        size_fn = self.settings.batch_size_fn
        if size_fn is None:
            return len(batch)
        return int(size_fn([item.args[0] if item.args else None for item in batch]))

    async def _process(self, batch: list[_Item]) -> None:
        try:
            live = [item for item in batch if not item.future.done()]  # cancelled callers
            if not live:
                return
            try:
                args, kwargs = _columns(live)
                results = self.fn(*args, **kwargs)
                if inspect.isawaitable(results):
                    results = await results
                if not isinstance(results, list | tuple) or len(results) != len(live):
                    got = len(results) if isinstance(results, list | tuple) else type(results)
                    raise TypeError(
                        f"a @serve.batch function must return a list as long as its batch "
                        f"({len(live)}), got {got}"
                    )
            except Exception as exc:
                for item in live:
                    if not item.future.done():
                        item.future.set_exception(exc)
                return
            for item, result in zip(live, results, strict=True):
                if not item.future.done():
                    item.future.set_result(result)
        finally:
            self.slots.release()


def _columns(items: list[_Item]) -> tuple[list[list[Any]], dict[str, list[Any]]]:
    """One list per positional argument and per keyword; every call must pass the same shape."""
    first = items[0]
    for item in items:
        if len(item.args) != len(first.args) or item.kwargs.keys() != first.kwargs.keys():
            raise TypeError("every call to a @serve.batch function must pass the same arguments")
    args = [[item.args[i] for item in items] for i in range(len(first.args))]
    kwargs = {key: [item.kwargs[key] for item in items] for key in first.kwargs}
    return args, kwargs


class _Settings:
    def __init__(
        self,
        max_batch_size: int,
        batch_wait_timeout_s: float,
        max_concurrent_batches: int,
        batch_size_fn: Callable[[list[Any]], int] | None,
    ) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        if not isinstance(batch_wait_timeout_s, int | float) or batch_wait_timeout_s < 0:
            raise ValueError(
                f"batch_wait_timeout_s must be a number >= 0, got {batch_wait_timeout_s!r}"
            )
        if not isinstance(max_concurrent_batches, int) or max_concurrent_batches < 1:
            raise ValueError(
                f"max_concurrent_batches must be an integer >= 1, got {max_concurrent_batches!r}"
            )
        if batch_size_fn is not None and not callable(batch_size_fn):
            raise ValueError("batch_size_fn must be callable")
        self.max_batch_size = max_batch_size
        self.batch_wait_timeout_s = float(batch_wait_timeout_s)
        self.max_concurrent_batches = max_concurrent_batches
        self.batch_size_fn = batch_size_fn


def _wrap(fn: Callable[..., Any], settings: _Settings) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(
            "kubeserve's @serve.batch does not take generator functions (streamed batches); "
            "return a list instead"
        )
    function_queue: list[BatchQueue] = []

    @functools.wraps(fn)
    async def batched(*args: Any, **kwargs: Any) -> Any:
        owner = args[0] if args and _is_method_call(args[0], batched) else None
        if owner is None:
            if not function_queue:
                function_queue.append(BatchQueue(settings, fn))
            queue = function_queue[0]
        else:
            queues: dict[int, BatchQueue] = owner.__dict__.setdefault(_QUEUE_ATTR, {})
            found = queues.get(id(batched))
            if found is None:
                found = queues[id(batched)] = BatchQueue(settings, functools.partial(fn, owner))
            queue = found
            args = args[1:]
        return await queue.put(args, kwargs)

    def set_max_batch_size(value: int) -> None:
        settings.max_batch_size = _Settings(value, 0, 1, None).max_batch_size

    def set_batch_wait_timeout_s(value: float) -> None:
        settings.batch_wait_timeout_s = _Settings(1, value, 1, None).batch_wait_timeout_s

    batched.set_max_batch_size = set_max_batch_size  # type: ignore[attr-defined]
    batched.set_batch_wait_timeout_s = set_batch_wait_timeout_s  # type: ignore[attr-defined]
    batched._get_max_batch_size = lambda: settings.max_batch_size  # type: ignore[attr-defined]
    batched._get_batch_wait_timeout_s = (  # type: ignore[attr-defined]
        lambda: settings.batch_wait_timeout_s
    )
    return batched


def _is_method_call(first: Any, wrapper: Callable[..., Any]) -> bool:
    bound = getattr(type(first), getattr(wrapper, "__name__", ""), None)
    return bound is wrapper


def batch(
    _func: Callable[..., Any] | None = None,
    /,
    max_batch_size: int = 10,
    batch_wait_timeout_s: float = 0.01,
    max_concurrent_batches: int = 1,
    batch_size_fn: Callable[[list[Any]], int] | None = None,
) -> Any:
    """``@batch`` or ``@batch(max_batch_size=..., batch_wait_timeout_s=...)`` (Ray's defaults)."""
    settings = _Settings(
        max_batch_size, batch_wait_timeout_s, max_concurrent_batches, batch_size_fn
    )
    if _func is not None:
        if not callable(_func):
            raise TypeError("@serve.batch can only be used to decorate functions or methods.")
        return _wrap(_func, settings)
    return lambda fn: _wrap(fn, settings)
