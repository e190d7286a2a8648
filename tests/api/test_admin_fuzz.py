"""Fuzz the admin API of a real ``kubeserve start`` from its own OpenAPI document (schemathesis).

Every operation gets a fixed number of generated requests, valid and invalid (derandomized, so a
run is repeatable); the server must never answer 5xx, and every 4xx must be a JSON error body.
The server requires a token, so the auth middleware is on the path of every request.

Generated bodies are defused before they are sent, so the fuzz cannot reach outside its sandbox:
the proxy always listens on this test's own port on 127.0.0.1 (a generated ``http_options``
could otherwise bind port 8000 of whoever else uses the machine), every ``import_path`` names a
module that does not exist (builds fail fast, nothing user-level runs), and remote
``working_dir``/``py_modules`` URIs are removed (no downloads). The caps of the schema bound what
a valid body can ask for.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from kubeserve.api.openapi import openapi_document
from kubeserve.api.server import ENDPOINTS, OPENAPI_PATH
from support.kubeserve_start import Kubeserve, running_kubeserve

#: Generated requests per operation and mode (valid, invalid); operations without inputs are
#: sent once. About 500 requests, one to two minutes on 2 cores.
EXAMPLES = 100
NOT_IMPORTABLE = "kubeserve_fuzz_nothing_here:app"
#: The operations, from the same document the server serves (pure, so known at collection), in
#: both modes, but for those without inputs (the token is fixed): nothing to make invalid there.
OPERATIONS = [
    (method.upper(), path, mode)
    for path, operations in openapi_document(ENDPOINTS, version="", bearer_auth=True)[
        "paths"
    ].items()
    for method, operation in operations.items()
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or {"requestBody", "parameters"} & set(operation)
]

#: (operation, mode, status) -> responses, reported when the module ends.
RESULTS: Counter[tuple[str, str, int]] = Counter()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    with running_kubeserve(tmp_path_factory.mktemp("fuzz"), token="fuzz-token") as server:
        yield server


@pytest.fixture(scope="module")
def admin_schema(fuzzed: Kubeserve, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The document as the running server serves it; reports the counts when the module ends."""
    yield schemathesis.openapi.from_url(f"{fuzzed.api}{OPENAPI_PATH}", headers=fuzzed.headers)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and RESULTS:
        statuses: Counter[int] = Counter()
        per_operation: dict[str, dict[str, int]] = {}
        for (operation, mode, status), count in sorted(RESULTS.items()):
            statuses[status] += count
            histogram = per_operation.setdefault(operation, {})
            histogram[f"{mode} {status}"] = count
        total = f"{sum(statuses.values())} requests, {json.dumps(dict(sorted(statuses.items())))}"
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nadmin API fuzz: {total}")
            for operation, histogram in per_operation.items():
                reporter.write_line(f"  {operation}: {json.dumps(histogram)}")


def defuse(value: Any, ks: Kubeserve) -> Any:
    """``value`` with the sandbox rules of the module docstring applied, at any depth."""
    if isinstance(value, list):
        return [defuse(item, ks) for item in value]
    if not isinstance(value, dict):
        return value
    out = {k: defuse(v, ks) for k, v in value.items() if k not in ("working_dir", "py_modules")}
    if "import_path" in out:  # an application: where it listens, what it imports
        out.update(import_path=NOT_IMPORTABLE, host="127.0.0.1", port=ks.proxy_port)
    if "http_options" in out or "applications" in out:
        out["http_options"] = {"host": "127.0.0.1", "port": ks.proxy_port}
    return out


@pytest.mark.parametrize(("method", "path", "mode"), OPERATIONS)
def test_admin_api_fuzz(
    admin_schema: Any, fuzzed: Kubeserve, method: str, path: str, mode: GenerationMode
) -> None:
    operation = admin_schema[path][method]

    # The token is fixed, so invalid requests are invalid in what they send, not in who sends it.
    @given(case=operation.as_strategy(generation_mode=mode, headers=fuzzed.headers))
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def fuzz(case: Any) -> None:
        if case.body is not None and not isinstance(case.body, str | bytes):
            case.body = defuse(case.body, fuzzed)
        response = case.call(base_url=fuzzed.api, headers=fuzzed.headers, timeout=120)
        status = response.status_code
        RESULTS[f"{method} {path}", mode.value, status] += 1
        sent = f"{method} {path} {case.query or ''} body={str(case.body)[:300]}"
        assert status < 500, f"{sent} -> {status}: {response.text[:500]}"
        if status >= 400:
            content_type = response.headers.get("content-type", [""])[0]
            assert content_type.startswith("application/json"), f"{sent} -> {status}"
            assert isinstance(response.json().get("error"), str), sent

    fuzz()


def test_fuzz_stayed_in_its_sandbox(fuzzed: Kubeserve) -> None:
    """Runs after the fuzz (file order): no proxy ever tried another address than this test's."""
    log = (fuzzed.state_dir / "logs" / "proxy.log").read_text()
    addresses = set(
        re.findall(r"(?:listening on|bind on address) \(?'?(?:https?://)?([^\s)]+)", log)
    )
    assert addresses and addresses <= {f"127.0.0.1:{fuzzed.proxy_port}"}, addresses
