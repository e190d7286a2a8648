"""What a data-plane process (a proxy, a replica of a plain deployment) must never import: the
control plane's and the optional features' heavy modules. The memory tests of each process add
what that process in particular does without (see ``benchmarks/README.md``'s memory tables)."""

from __future__ import annotations

from collections.abc import Iterable

#: Module prefixes neither a proxy nor a plain replica loads.
DATA_PLANE_NEVER = (
    "pydantic",
    "kubeserve.schema",
    "kubeserve.backends",
    "kubeserve.api",
    "kubeserve.cli",
    "kubeserve.runtime.handle_client",
    "kubeserve.runtime.runtime_env",
    "kubeserve.runtime.tracer",
    "kubernetes_asyncio",
    "prometheus_client",
    "starlette",
    "fastapi",
    "grpc",
    "opentelemetry",
    "wsproto",
    "yaml",
    "ray",
    "aiohttp",
    "email",
    "sqlite3",
    "xml",
    "shutil",  # (with zlib, bz2, lzma)
    "encodings.idna",  # a str host given to create_server (with stringprep, unicodedata)
)


def loaded(modules: Iterable[str], prefixes: Iterable[str]) -> list[str]:
    """The names in ``modules`` that are one of ``prefixes`` or inside one of them."""
    wanted = tuple(prefixes)
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in wanted)]
