"""Prepare the environment a replica or an application build runs in, from a ``runtime_env``.

A deployment's environment is the application's ``runtime_env`` overlaid with the deployment's
``ray_actor_options.runtime_env`` (:func:`merge_runtime_env`, pure). :func:`prepare` then makes it
real on this machine: ``working_dir`` and every ``py_modules`` entry are zip archives fetched over
http(s) and unpacked into a cache directory, and ``pip`` / ``uv`` packages are installed into an
environment of :mod:`kubeserve.runtime.python_env` under ``<cache_dir>/python``; the result says
which directory to run in, what to prepend to ``PYTHONPATH`` (working_dir, py_modules, then the
packages) and which environment variables to set.

Cache invariants (the cache directory may be shared by many processes):

- an entry is the directory ``<cache_dir>/<sha256 of the URI>``; it exists only complete, because
  archives are downloaded to a temporary file and unpacked into a temporary directory, each renamed
  into place atomically. A URI is therefore fetched once, and a crash leaves only ``*.tmp-*``
  leftovers, never a half entry;
- within one event loop, concurrent prepares of one URI share a single fetch; across processes
  the loser of the final rename discards its copy.

Archives are untrusted input: a member with an absolute path, a ``..`` component, a path resolving
outside the target directory, or a symlink rejects the whole archive; sizes are bounded by
:class:`FetchLimits`. Only http(s) URIs can be fetched by the local backend; object-store schemes
(``s3://``, ``gs://``...) are valid in a config but fail here with a clear :class:`RuntimeEnvError`.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import os
import shutil
import stat
import uuid
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from kubeserve.runtime import python_env
from kubeserve.schema.packages import package_spec

__all__ = [
    "FetchLimits",
    "PreparedEnv",
    "RuntimeEnvError",
    "asks_for_packages",
    "merge_runtime_env",
    "prepare",
]

_FETCHABLE_SCHEMES = frozenset({"http", "https"})
# Keys that need no action on this machine: ``excludes`` applies to uploading a local directory,
# ``config`` tunes Ray's own setup (timeouts). Any other key the local backend cannot honour is an
# error rather than a silently different environment.
_NO_OP_KEYS = frozenset({"excludes", "config"})
_HANDLED_KEYS = frozenset({"working_dir", "py_modules", "env_vars", "pip", "uv"})
#: where the environments of ``pip`` / ``uv`` packages live, under the cache directory
PYTHON_ENVS = "python"
_CHUNK = 1 << 20


class RuntimeEnvError(Exception):
    """The runtime environment cannot be prepared; the message names the URI and the cause."""


@dataclass(frozen=True)
class FetchLimits:
    """Bounds on what one archive may cost; generous for code, fatal for zip bombs."""

    max_download_bytes: int = 512 * 1024 * 1024
    max_unpacked_bytes: int = 2 * 1024 * 1024 * 1024
    max_members: int = 100_000
    timeout_s: float = 300.0


@dataclass(frozen=True)
class PreparedEnv:
    """What a process launcher applies: variables to set, ``PYTHONPATH`` prefix, working dir."""

    env_vars: dict[str, str] = field(default_factory=dict)
    python_path: list[str] = field(default_factory=list)
    cwd: str | None = None
    #: the key of the ``pip`` / ``uv`` environment on ``python_path`` (None: no packages)
    python_env: str | None = None


def merge_runtime_env(
    app_env: Mapping[str, Any] | None, deployment_env: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The deployment's effective runtime_env: its keys override the application's.

    ``env_vars`` are merged key by key (the deployment's value wins), as in Ray. Pure: the inputs
    are not modified and the result shares no mutable value with them.
    """
    merged: dict[str, Any] = copy.deepcopy(dict(app_env or {}))
    for key, value in (deployment_env or {}).items():
        if key == "env_vars":
            merged["env_vars"] = {**(merged.get("env_vars") or {}), **copy.deepcopy(value or {})}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def asks_for_packages(runtime_env: Mapping[str, Any]) -> bool:
    """Whether preparing ``runtime_env`` installs packages (and may take minutes)."""
    return any(runtime_env.get(key) is not None for key in ("pip", "uv"))


async def prepare(
    runtime_env: Mapping[str, Any],
    cache_dir: Path,
    *,
    limits: FetchLimits = FetchLimits(),
    on_install: Callable[[str], None] | None = None,
) -> PreparedEnv:
    """Fetch and unpack ``working_dir`` and ``py_modules``, install ``pip`` / ``uv`` packages
    and collect ``env_vars``.

    ``python_path`` lists the working directory first (as Ray puts it on ``sys.path``), then each
    module root in the order given, then the packages' directory. Idempotent: a second call for
    the same URIs and packages only reads the cache. ``on_install`` is told when packages are
    actually being installed (what, for the application's status).
    """
    env = {k: v for k, v in runtime_env.items() if v is not None}
    unsupported = sorted(set(env) - _HANDLED_KEYS - _NO_OP_KEYS)
    if unsupported:
        raise RuntimeEnvError(
            f"runtime_env keys {unsupported} are not supported by the local backend "
            f"(supported: working_dir, py_modules, env_vars, pip, uv)"
        )
    env_vars = _env_vars(env.get("env_vars", {}))
    try:
        packages = package_spec(env)
    except ValueError as err:
        raise RuntimeEnvError(str(err)) from err
    modules = env.get("py_modules", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise RuntimeEnvError("runtime_env.py_modules must be a list of URIs")
    working_dir = env.get("working_dir")
    if working_dir is not None and not isinstance(working_dir, str):
        raise RuntimeEnvError("runtime_env.working_dir must be a URI")

    await asyncio.to_thread(cache_dir.mkdir, parents=True, exist_ok=True)
    uris = ([working_dir] if working_dir else []) + modules
    entries = await asyncio.gather(*(_cached(uri, cache_dir, limits) for uri in uris))
    roots = await asyncio.to_thread(_roots, entries, bool(working_dir))
    cwd = roots[0] if working_dir else None
    module_roots = roots[1:] if working_dir else roots
    site: list[str] = []
    key = None
    if packages is not None:
        try:
            plan = python_env.install_plan(
                packages,
                working_dir=Path(cwd) if cwd else None,
                working_dir_uri=working_dir,
                env_vars=env_vars,
                environ=os.environ,
            )
            root = cache_dir / PYTHON_ENVS
            site = [
                str(
                    await python_env.build(
                        plan, root, cwd=Path(cwd) if cwd else None, on_install=on_install
                    )
                )
            ]
        except python_env.PythonEnvError as err:
            raise RuntimeEnvError(str(err)) from err
        key = plan.key
    return PreparedEnv(
        env_vars=env_vars,
        python_path=([cwd] if cwd else []) + module_roots + site,
        cwd=cwd,
        python_env=key,
    )


def _env_vars(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RuntimeEnvError("runtime_env.env_vars must map strings to strings")
    return dict(value)


# --------------------------------------------------------------------------- cache


_inflight: dict[Path, asyncio.Task[Path]] = {}


async def _cached(uri: str, cache_dir: Path, limits: FetchLimits) -> Path:
    """The unpacked entry for ``uri``, fetching it unless present or already being fetched."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme not in _FETCHABLE_SCHEMES:
        what = f"the {scheme}:// scheme is" if scheme else "a local path is"
        raise RuntimeEnvError(
            f"cannot fetch {uri!r}: {what} not supported by the local backend "
            f"(use an http:// or https:// URI of a zip archive)"
        )
    entry = cache_dir / hashlib.sha256(uri.encode()).hexdigest()
    if await asyncio.to_thread(entry.is_dir):
        return entry
    task = _inflight.get(entry)
    if task is None or task.get_loop() is not asyncio.get_running_loop():
        task = asyncio.ensure_future(_fetch_into(uri, entry, limits))
        _inflight[entry] = task
        task.add_done_callback(
            lambda t: _inflight.pop(entry, None) if _inflight.get(entry) is t else None
        )
    return await asyncio.shield(task)


async def _fetch_into(uri: str, entry: Path, limits: FetchLimits) -> Path:
    tag = f".tmp-{uuid.uuid4().hex}"
    archive = entry.with_name(entry.name + tag + ".zip")
    staging = entry.with_name(entry.name + tag)
    try:
        await _download(uri, archive, limits)
        await asyncio.to_thread(_install, uri, archive, staging, entry, limits)
    finally:
        await asyncio.to_thread(_discard, archive, staging)
    return entry


def _install(uri: str, archive: Path, staging: Path, entry: Path, limits: FetchLimits) -> None:
    """Unpack into ``staging``, then publish it as ``entry`` with one atomic rename; blocking."""
    try:
        _unpack(uri, archive, staging, limits)
        try:
            staging.rename(entry)
        except OSError:
            if not entry.is_dir():  # not a lost race with another process: a real failure
                raise
    except OSError as err:
        raise RuntimeEnvError(f"cannot store {uri!r} in the cache {entry.parent}: {err}") from err


def _discard(archive: Path, staging: Path) -> None:
    archive.unlink(missing_ok=True)
    if staging.exists():
        shutil.rmtree(staging, ignore_errors=True)


async def _download(uri: str, dest: Path, limits: FetchLimits) -> None:
    timeout = aiohttp.ClientTimeout(total=limits.timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(uri) as response,
        ):
            if response.status != 200:
                reason = f" {response.reason}" if response.reason else ""
                raise RuntimeEnvError(f"fetching {uri!r} failed: HTTP {response.status}{reason}")
            if (response.content_length or 0) > limits.max_download_bytes:
                raise RuntimeEnvError(_too_big(uri, limits.max_download_bytes))
            out = await asyncio.to_thread(dest.open, "wb")
            try:
                size = 0
                async for chunk in response.content.iter_chunked(_CHUNK):
                    size += len(chunk)
                    if size > limits.max_download_bytes:
                        raise RuntimeEnvError(_too_big(uri, limits.max_download_bytes))
                    await asyncio.to_thread(out.write, chunk)
            finally:
                await asyncio.to_thread(out.close)
    except (aiohttp.ClientError, TimeoutError) as err:
        raise RuntimeEnvError(f"fetching {uri!r} failed: {type(err).__name__}: {err}") from err


def _too_big(uri: str, limit: int) -> str:
    return f"fetching {uri!r} failed: the archive is larger than {limit} bytes"


# --------------------------------------------------------------------------- unpacking


def _unpack(uri: str, archive: Path, target: Path, limits: FetchLimits) -> None:
    """Extract every member into ``target`` after checking all of them; blocking."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            if len(members) > limits.max_members:
                raise RuntimeEnvError(f"{uri!r} has more than {limits.max_members} members")
            target.mkdir()
            root = target.resolve()
            for info in members:
                _check_member(uri, info, root)
            budget = limits.max_unpacked_bytes
            for info in members:
                budget = _extract(uri, zf, info, root, budget)
    except zipfile.BadZipFile as err:
        raise RuntimeEnvError(f"{uri!r} is not a valid zip archive: {err}") from err


def _check_member(uri: str, info: zipfile.ZipInfo, root: Path) -> None:
    name = info.filename
    parts = PurePosixPath(name.replace("\\", "/")).parts
    unsafe = (
        name.startswith(("/", "\\"))
        or (len(name) > 1 and name[1] == ":")
        or ".." in parts
        or not (root / name).resolve().is_relative_to(root)
    )
    if unsafe:
        raise RuntimeEnvError(f"{uri!r} is unsafe: member {name!r} points outside the archive")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise RuntimeEnvError(f"{uri!r} is unsafe: member {name!r} is a symbolic link")


def _extract(uri: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, root: Path, budget: int) -> int:
    """Write one member, counting real bytes (headers can lie); returns the remaining budget."""
    path = root / info.filename
    if info.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        return budget
    path.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(info) as src, path.open("wb") as dst:
        while chunk := src.read(_CHUNK):
            budget -= len(chunk)
            if budget < 0:
                raise RuntimeEnvError(f"{uri!r} unpacks to more than the allowed size")
            dst.write(chunk)
    mode = (info.external_attr >> 16) & 0o777
    if mode:
        os.chmod(path, mode | stat.S_IRUSR | stat.S_IWUSR)
    return budget


def _roots(entries: list[Path], has_working_dir: bool) -> list[str]:
    """Root directories of the fetched entries: the working_dir first when there is one."""
    roots = [_working_dir_root(entries[0])] if has_working_dir else []
    roots += [_module_root(e) for e in entries[1 if has_working_dir else 0 :]]
    return [str(r) for r in roots]


def _single_directory(entry: Path) -> Path | None:
    children = [c for c in entry.iterdir() if c.name != "__MACOSX"]
    if len(children) == 1 and children[0].is_dir():
        return children[0]
    return None


def _working_dir_root(entry: Path) -> Path:
    """A zip of one top-level directory (e.g. a repository archive) runs inside it, as in Ray."""
    return _single_directory(entry) or entry


def _module_root(entry: Path) -> Path:
    """The directory to put on ``PYTHONPATH`` for a ``py_modules`` archive.

    A zip of one *package* (``pkg/__init__.py``) is importable from the entry itself; a zip of
    one plain directory holding packages is unwrapped like a working_dir.
    """
    single = _single_directory(entry)
    if single is not None and not (single / "__init__.py").exists():
        return single
    return entry


async def fetch_into(
    dest: Path,
    working_dir: str | None,
    py_modules: list[str],
    packages: Mapping[str, Any] | None = None,
) -> None:
    """Lay out fetched code where a pod's main container expects it (the init container's job).

    ``<dest>/working_dir`` is the root of the working directory, ``<dest>/py_modules/<i>`` the
    import root of module ``i`` and ``<dest>/python`` the ``site`` directory of the ``packages``
    (``{"pip": ...}`` or ``{"uv": ...}``): symlinks into ``<dest>/.cache``, where they are made.
    The installer's environment is this process's, which holds the runtime_env's env_vars.
    """
    runtime_env: dict[str, Any] = {"py_modules": list(py_modules), **(packages or {})}
    if working_dir:
        runtime_env["working_dir"] = working_dir
    prepared = await prepare(runtime_env, dest / ".cache")
    roots = list(prepared.python_path)
    if prepared.python_env is not None:
        _link(dest / "python", Path(roots.pop()))
    if working_dir:
        _link(dest / "working_dir", Path(roots.pop(0)))
    for index, root in enumerate(roots):
        _link(dest / "py_modules" / str(index), Path(root))


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target.resolve(), target_is_directory=True)
