"""Runtime environments: merging, fetching zips over real HTTP, safe unpacking, the cache."""

from __future__ import annotations

import asyncio
import io
import stat
import sys
import zipfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest
from aiohttp import web

from kubeserve.runtime.runtime_env import (
    FetchLimits,
    PreparedEnv,
    RuntimeEnvError,
    fetch_into,
    merge_runtime_env,
    prepare,
)
from support.common import run

T = TypeVar("T")


def make_zip(files: dict[str, str], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


class ZipServer:
    """A real HTTP server on 127.0.0.1 serving zips from memory, counting requests per path."""

    def __init__(self, files: dict[str, bytes], delay_s: float = 0.0) -> None:
        self.files = files
        self.delay_s = delay_s
        self.hits: Counter[str] = Counter()
        self.base = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        body = self.files.get(request.path)
        if body is None:
            return web.Response(status=404, text="no such file")
        return web.Response(body=body, content_type="application/zip")

    def url(self, path: str) -> str:
        return self.base + path


@asynccontextmanager
async def serving(files: dict[str, bytes], delay_s: float = 0.0) -> AsyncIterator[ZipServer]:
    server = ZipServer(files, delay_s)
    app = web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.base = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------- merge


def test_merge_deployment_keys_override_and_env_vars_merge_key_by_key() -> None:
    app = {"working_dir": "https://h/app.zip", "env_vars": {"A": "app", "B": "app"}}
    dep = {"py_modules": ["https://h/m.zip"], "env_vars": {"B": "dep", "C": "dep"}}
    merged = merge_runtime_env(app, dep)
    assert merged == {
        "working_dir": "https://h/app.zip",
        "py_modules": ["https://h/m.zip"],
        "env_vars": {"A": "app", "B": "dep", "C": "dep"},
    }
    assert app["env_vars"] == {"A": "app", "B": "app"}  # inputs untouched
    merged["py_modules"].append("x")
    assert dep["py_modules"] == ["https://h/m.zip"]


def test_merge_with_missing_sides() -> None:
    assert merge_runtime_env(None, None) == {}
    assert merge_runtime_env({"working_dir": "https://h/a.zip"}, None) == {
        "working_dir": "https://h/a.zip"
    }
    assert merge_runtime_env(None, {"env_vars": {"A": "1"}}) == {"env_vars": {"A": "1"}}
    dep_wd = merge_runtime_env(
        {"working_dir": "https://h/a.zip"}, {"working_dir": "https://h/b.zip"}
    )
    assert dep_wd == {"working_dir": "https://h/b.zip"}


# --------------------------------------------------------------------------- prepare


APP_ZIP = make_zip({"repo-main/app.py": "VALUE = 1\n", "repo-main/data/x.txt": "x"})
FLAT_ZIP = make_zip({"app.py": "VALUE = 2\n", "other.py": ""})
PKG_ZIP = make_zip({"mypkg/__init__.py": "NAME = 'mypkg'\n"})


def test_env_vars_only_needs_no_fetch(tmp_path: Path) -> None:
    prepared = run(prepare({"env_vars": {"A": "1"}, "excludes": ["*.pyc"]}, tmp_path))
    assert prepared == PreparedEnv(env_vars={"A": "1"}, python_path=[], cwd=None)


def test_working_dir_and_py_modules_are_fetched_and_importable(tmp_path: Path) -> None:
    async def scenario() -> PreparedEnv:
        async with serving({"/app.zip": APP_ZIP, "/pkg.zip": PKG_ZIP, "/flat.zip": FLAT_ZIP}) as s:
            env = {
                "working_dir": s.url("/app.zip"),
                "py_modules": [s.url("/pkg.zip"), s.url("/flat.zip")],
                "env_vars": {"A": "1"},
            }
            return await prepare(env, tmp_path)

    prepared = run(scenario(), 20)
    assert prepared.cwd is not None
    cwd = Path(prepared.cwd)
    assert cwd.name == "repo-main"  # single top-level directory becomes the root
    assert (cwd / "app.py").read_text() == "VALUE = 1\n"
    assert prepared.python_path[0] == prepared.cwd
    pkg_root, flat_root = map(Path, prepared.python_path[1:])
    assert (pkg_root / "mypkg" / "__init__.py").exists()  # a package zip stays importable
    assert (flat_root / "app.py").read_text() == "VALUE = 2\n"
    assert prepared.env_vars == {"A": "1"}
    sys.path.insert(0, str(pkg_root))
    try:
        import mypkg  # type: ignore[import-not-found]

        assert mypkg.NAME == "mypkg"
    finally:
        sys.path.remove(str(pkg_root))
        sys.modules.pop("mypkg", None)


def test_flat_working_dir_is_the_entry_itself(tmp_path: Path) -> None:
    async def scenario() -> PreparedEnv:
        async with serving({"/flat.zip": FLAT_ZIP}) as s:
            return await prepare({"working_dir": s.url("/flat.zip")}, tmp_path)

    prepared = run(scenario(), 20)
    assert prepared.cwd is not None and (Path(prepared.cwd) / "other.py").exists()


def test_uri_is_fetched_once_even_by_concurrent_prepares(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[PreparedEnv], PreparedEnv, int]:
        async with serving({"/app.zip": APP_ZIP}, delay_s=0.2) as s:
            env = {"working_dir": s.url("/app.zip")}
            results = await asyncio.gather(*(prepare(env, tmp_path) for _ in range(5)))
            again = await prepare(env, tmp_path)
            return list(results), again, s.hits["/app.zip"]

    results, again, hits = run(scenario(), 20)
    assert hits == 1
    assert {r.cwd for r in results} == {again.cwd}
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no leftovers


def test_http_error_names_url_and_status(tmp_path: Path) -> None:
    async def scenario() -> str:
        async with serving({}) as s:
            with pytest.raises(RuntimeEnvError) as info:
                await prepare({"working_dir": s.url("/missing.zip")}, tmp_path)
            return str(info.value)

    message = run(scenario(), 20)
    assert "/missing.zip" in message and "HTTP 404" in message
    assert list(tmp_path.iterdir()) == []


def test_connection_refused_is_a_runtime_env_error(tmp_path: Path) -> None:
    async def scenario() -> str:
        async with serving({}) as s:
            url = s.url("/a.zip")
        with pytest.raises(RuntimeEnvError) as info:  # server is gone now
            await prepare({"working_dir": url}, tmp_path)
        return str(info.value)

    assert "fetching" in run(scenario(), 20)


@pytest.mark.parametrize("uri", ["s3://bucket/a.zip", "gs://bucket/a.zip", "/local/dir"])
def test_non_http_schemes_are_not_supported_locally(tmp_path: Path, uri: str) -> None:
    with pytest.raises(RuntimeEnvError, match="not supported by the local backend"):
        run(prepare({"working_dir": uri}, tmp_path))


def test_keys_the_local_backend_cannot_honour_are_errors(tmp_path: Path) -> None:
    with pytest.raises(RuntimeEnvError, match=r"\['conda'\]"):
        run(prepare({"conda": {"dependencies": ["requests"]}}, tmp_path))


def test_env_vars_must_be_strings(tmp_path: Path) -> None:
    with pytest.raises(RuntimeEnvError, match="env_vars"):
        run(prepare({"env_vars": {"A": 1}}, tmp_path))


# --------------------------------------------------------------------------- malicious archives


@pytest.mark.parametrize(
    ("archive", "reason"),
    [
        (make_zip({"ok.py": "", "../evil.py": "x"}), "outside"),
        (make_zip({"a/../../evil.py": "x"}), "outside"),
        (make_zip({"/etc/evil.py": "x"}), "outside"),
        (make_zip({"ok.py": ""}, symlinks={"link": "/etc/passwd"}), "symbolic link"),
        (b"this is not a zip", "not a valid zip"),
    ],
)
def test_unsafe_or_broken_archives_are_rejected(
    tmp_path: Path, archive: bytes, reason: str
) -> None:
    cache = tmp_path / "cache"

    async def scenario() -> str:
        async with serving({"/bad.zip": archive}) as s:
            with pytest.raises(RuntimeEnvError) as info:
                await prepare({"working_dir": s.url("/bad.zip")}, cache)
            return str(info.value)

    message = run(scenario(), 20)
    assert reason in message and "/bad.zip" in message
    assert list(cache.iterdir()) == []  # nothing half-extracted is left in the cache
    assert not (tmp_path / "evil.py").exists()


def test_size_limits(tmp_path: Path) -> None:
    big = make_zip({"big.bin": "0" * 100_000})

    async def scenario() -> tuple[str, str]:
        async with serving({"/big.zip": big}) as s:
            with pytest.raises(RuntimeEnvError) as unpacked:
                await prepare(
                    {"working_dir": s.url("/big.zip")},
                    tmp_path,
                    limits=FetchLimits(max_unpacked_bytes=10_000),
                )
            with pytest.raises(RuntimeEnvError) as download:
                await prepare(
                    {"working_dir": s.url("/big.zip")},
                    tmp_path,
                    limits=FetchLimits(max_download_bytes=100),
                )
            return str(unpacked.value), str(download.value)

    unpacked, download = run(scenario(), 20)
    assert "allowed size" in unpacked
    assert "larger than 100 bytes" in download


def test_fetch_into_lays_out_working_dir_and_modules(tmp_path: Path) -> None:
    """The layout the Kubernetes init container leaves for the replica container."""
    work = make_zip({"proj/app_mod.py": "VALUE = 1\n"})
    module = make_zip({"pkg/__init__.py": "NAME = 'pkg'\n"})

    async def scenario() -> None:
        async with serving({"/work.zip": work, "/pkg.zip": module}) as server:
            await fetch_into(tmp_path, server.url("/work.zip"), [server.url("/pkg.zip")])

    run(scenario(), 20)
    assert (tmp_path / "working_dir" / "app_mod.py").read_text() == "VALUE = 1\n"
    assert (tmp_path / "py_modules" / "0" / "pkg" / "__init__.py").exists()
