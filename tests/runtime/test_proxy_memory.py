"""The proxy of ``kubeserve start``, after serving traffic (requests the native data path answers,
and ones it hands to the Python proxy: ``/-/healthz``, ``/-/routes``, a 404), has imported
nothing heavy it does not use, on either data path: no schema models or pydantic, no admin API or
backend, no Kubernetes client, no prometheus_client, gRPC, OpenTelemetry, websocket library or
YAML, no replica code, and none of the standard modules a proxy does without: ``pickle`` and
``logging.handlers``, ``tempfile`` and ``shutil`` (with zlib, bz2, lzma), ``pathlib``, ``uuid``,
``datetime``, ``http`` (its enum), ``urllib.parse`` and ``ipaddress`` (until a path holds a
``%``), the idna codec; behind the native data path, not uvloop either (see the memory tables in
``benchmarks/README.md``). No timing or size is measured.

The proxy is the real one ``kubeserve start`` runs (``python -m kubeserve.runtime.proxy``); a
``sitecustomize`` on its ``PYTHONPATH`` adds a thread that, once the test creates a file, writes
each process's ``sys.modules`` to a file of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeserve.runtime.fastpath import find_binary
from support.common import http, wait_for
from support.kubeserve_start import Kubeserve, running_kubeserve
from support.lean_imports import DATA_PLANE_NEVER, loaded

#: Lists the process's modules into ``$MODULES_OUT/<pid>.json`` once ``$MODULES_OUT/go`` exists
#: (imports nothing a proxy does not import anyway).
_SITECUSTOMIZE = """
import os, sys, threading, time
def _dump(folder):
    while not os.path.exists(os.path.join(folder, 'go')):
        time.sleep(0.2)
    path = os.path.join(folder, '%d.json' % os.getpid())
    with open(path + '.part', 'w') as out:
        out.write('[' + ','.join('"%s"' % name for name in sorted(sys.modules)) + ']')
    os.rename(path + '.part', path)
if os.environ.get('MODULES_OUT'):
    threading.Thread(target=_dump, args=(os.environ['MODULES_OUT'],), daemon=True).start()
"""

#: Module prefixes the proxy must not load.
HEAVY = (
    *DATA_PLANE_NEVER,
    "kubeserve.compat",
    "kubeserve.runtime.replica",
    "kubeserve.runtime.proxy.grpc_ingress",
    "cryptography",  # loaded when TLS files are checked, not without TLS
    "http",  # its HTTPStatus enum: reason phrases are kubeserve.runtime.http1.REASONS
    "pickle",  # with logging.handlers, which kubeserve.runtime.logs.RotatingLog does without
    "logging.handlers",
    "tempfile",  # kubeserve.runtime.private_dir instead
    "pathlib",
    "uuid",  # (with platform)
    "datetime",
    "urllib.parse",  # (with ipaddress) imported by the first request path holding a "%"
    "ipaddress",
)


@pytest.fixture(scope="module", params=["native", "python"])
def proxy_kubeserve(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Kubeserve, Path, str]]:
    data_path: str = request.param
    if data_path == "native" and find_binary() is None:
        pytest.fail("no kubeserve-fastpath binary: `make native` builds it (`make test` does)")
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    out = tmp_path_factory.mktemp("modules")
    os.environ["MODULES_OUT"] = str(out)
    try:
        with running_kubeserve(
            tmp_path_factory.mktemp("kubeserve"),
            args=("--data-path", data_path),
            python_path=(site,),
        ) as server:
            yield server, out, data_path
    finally:
        del os.environ["MODULES_OUT"]


def _fastpath_children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in found if "kubeserve-fastpath" in Path(f"/proc/{c}/cmdline").read_text()]


def test_a_proxy_loads_nothing_heavy_after_serving(
    proxy_kubeserve: tuple[Kubeserve, Path, str],
) -> None:
    server, out, data_path = proxy_kubeserve
    status, _ = server.put(
        [{"name": "light", "route_prefix": "/light", "import_path": "ks_light_app:app"}]
    )
    assert status == 200
    server.wait_app("light")
    server.wait_routed("light", "/light")
    for _ in range(50):
        assert http("GET", f"{server.proxy}/light")[0] == 200
    assert http("GET", f"{server.proxy}/-/healthz")[0] == 200
    assert http("GET", f"{server.proxy}/-/routes")[0] == 200
    assert http("GET", f"{server.proxy}/nowhere")[0] == 404
    proxy = int(next(iter(server.details()["proxies"].values()))["worker_id"])
    assert len(_fastpath_children(proxy)) == (1 if data_path == "native" else 0)
    (out / "go").touch()
    dumped = out / f"{proxy}.json"
    wait_for(dumped.exists, 10, what="the proxy's list of modules")
    modules = json.loads(dumped.read_text())
    assert "kubeserve.runtime.proxy.server" in modules  # the list is of a real proxy
    heavy = loaded(modules, HEAVY)
    assert not heavy, heavy
    # behind the native data path the proxy runs on asyncio's own loop, uvloop only without it
    assert ("uvloop" in modules) == (data_path == "python")
