"""``@multiplexed``: a replica keeps up to N models loaded and loads the one a request names.

The wrapped loader takes a model id and returns the model (sync or async). Calls with an id already
loaded return the cached model; a call for a new id loads it, evicting the least recently used
model once ``max_num_models_per_replica`` are loaded. Concurrent calls for one id share one load.
An evicted model's ``__del__`` (awaited when it is a coroutine function), as Ray does, lets it free
its resources at once.

Which model a request wants is :func:`get_multiplexed_model_id`: the ``serve_multiplexed_model_id``
HTTP header, or ``handle.options(multiplexed_model_id=...)`` for handle calls (the runtime puts it
in :data:`kubeserve.sdk.context.request_context`).

What a replica holds is :func:`loaded_model_ids` (every cache of the process, most recently used
first); the replica tells its callers in the answer to each multiplexed request, and their routers
send later requests for a model to a replica that holds it (:mod:`kubeserve.runtime.router`).
:func:`models_version` changes whenever that list may have, so the answer's header is formatted
again only then.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kubeserve.sdk.context import request_context

__all__ = [
    "MODEL_ID_HEADER",
    "get_multiplexed_model_id",
    "loaded_model_ids",
    "models_version",
    "multiplexed",
]

#: The HTTP header naming the model of a request, as in Ray Serve.
MODEL_ID_HEADER = "serve_multiplexed_model_id"
_CACHE_ATTR = "_kubeserve_model_caches"


def get_multiplexed_model_id() -> str:
    """The model id of the request being served ("" when it named none)."""
    current = request_context.get()
    return "" if current is None else current.multiplexed_model_id


#: Every model cache of this process (one per ``@multiplexed`` loader, per instance for methods).
_caches: weakref.WeakSet[_ModelCache] = weakref.WeakSet()
#: Bumped whenever a cache's models or their order change (see :func:`models_version`).
_version = 0


def _changed() -> None:
    global _version
    _version += 1


def models_version() -> int:
    """A number that changes whenever :func:`loaded_model_ids` may have changed."""
    return _version


def loaded_model_ids() -> list[str]:
    """The models loaded in this process (every cache), most recently used first."""
    caches = list(_caches)
    if len(caches) == 1:
        return list(reversed(caches[0].models))
    seen: dict[str, None] = {}
    for cache in caches:
        for model_id in reversed(cache.models):
            seen.setdefault(model_id)
    return list(seen)


class _ModelCache:
    def __init__(self, load: Callable[[str], Any], capacity: int) -> None:
        self.load = load
        self.capacity = capacity
        self.models: OrderedDict[str, Any] = OrderedDict()
        self.loading: dict[str, asyncio.Future[Any]] = {}
        _caches.add(self)

    async def get(self, model_id: str) -> Any:
        if model_id in self.models:
            if next(reversed(self.models)) != model_id:
                self.models.move_to_end(model_id)
                _changed()
            return self.models[model_id]
        pending = self.loading.get(model_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.loading[model_id] = future
        try:
            while len(self.models) >= self.capacity:
                _, evicted = self.models.popitem(last=False)
                _changed()
                await _unload(evicted)
            model = self.load(model_id)
            if inspect.isawaitable(model):
                model = await model
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            self.loading.pop(model_id, None)
        self.models[model_id] = model
        _changed()
        future.set_result(model)
        return model


async def _unload(model: Any) -> None:
    finalizer = getattr(model, "__del__", None)
    if finalizer is None:
        return
    result = finalizer()
    if inspect.isawaitable(result):
        await result


def multiplexed(func: Callable[..., Any] | None = None, max_num_models_per_replica: int = 3) -> Any:
    """``@multiplexed`` or ``@multiplexed(max_num_models_per_replica=N)`` on a model loader."""
    if not isinstance(max_num_models_per_replica, int) or (
        max_num_models_per_replica < 1 and max_num_models_per_replica != -1
    ):
        raise ValueError("max_num_models_per_replica must be a positive integer or -1")
    capacity = max_num_models_per_replica if max_num_models_per_replica > 0 else 2**62

    def wrap(load: Callable[..., Any]) -> Callable[..., Any]:
        shared: list[_ModelCache] = []

        @functools.wraps(load)
        async def get_model(*args: Any) -> Any:
            if len(args) == 2:  # a method: (self, model_id); the cache belongs to the instance
                owner, model_id = args
                caches: dict[int, _ModelCache] = owner.__dict__.setdefault(_CACHE_ATTR, {})
                cache = caches.get(id(get_model))
                if cache is None:
                    cache = caches[id(get_model)] = _ModelCache(
                        functools.partial(load, owner), capacity
                    )
            elif len(args) == 1:
                (model_id,) = args
                if not shared:
                    shared.append(_ModelCache(load, capacity))
                cache = shared[0]
            else:
                raise TypeError("a @serve.multiplexed function takes exactly one model id")
            if not isinstance(model_id, str):
                raise TypeError(f"a model id must be a str, got {type(model_id).__name__}")
            return await cache.get(model_id)

        return get_model

    if func is not None:
        return wrap(func)
    return wrap
