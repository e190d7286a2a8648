"""Who may use the admin API of ``kubeserve start``: bearer token, Host check, refusal to listen
openly without a token; and the HTTP semantics clients rely on (405 + Allow, ?api_type)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.common import ROOT, free_port, http
from support.kubeserve_start import Kubeserve, running_kubeserve

TOKEN = "t0ken-for-tests"
HELLO = {"name": "hello", "route_prefix": "/hello", "import_path": "examples.hello:app"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    """A ``kubeserve start`` whose admin API requires :data:`TOKEN`."""
    with running_kubeserve(tmp_path_factory.mktemp("secured"), token=TOKEN) as server:
        yield server


def kubeserve_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "KUBESERVE_AUTH_TOKEN"}
    environ["PYTHONPATH"] = str(ROOT / "operator")
    return subprocess.run(
        [sys.executable, "-m", "kubeserve.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
    )


# --------------------------------------------------------------------------- bearer token


def test_no_token_is_401_json_with_a_bearer_challenge(secured: Kubeserve) -> None:
    paths = ("/api/serve/applications/", "/api/ray/version", "/api/serve/openapi.json", "/metrics")
    for path in paths:
        status, body = http("GET", f"{secured.api}{path}")
        assert status == 401, path
        assert "Authorization: Bearer" in body["error"]
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{secured.api}/api/serve/applications/", timeout=10)
    assert info.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_wrong_token_is_403_as_in_rays_dashboard(secured: Kubeserve) -> None:
    for header in ("Bearer wrong", "Basic dXNlcjpwYXNz", f"Bearer {TOKEN}x", "Bearer \u00e9"):
        status, body = http(
            "GET", f"{secured.api}/api/serve/applications/", headers={"Authorization": header}
        )
        assert status == 403, header
        assert "token" in body["error"]


def test_right_token_in_either_header_and_any_scheme_case(secured: Kubeserve) -> None:
    for name, value in (
        ("Authorization", f"Bearer {TOKEN}"),
        ("Authorization", f"bearer {TOKEN}"),
        ("X-Ray-Authorization", f"Bearer {TOKEN}"),
    ):
        status, body = http("GET", f"{secured.api}/api/ray/version", headers={name: value})
        assert (status, body["ray_version"]) == (200, "2.60.0")


def test_health_stays_open(secured: Kubeserve) -> None:
    assert http("GET", f"{secured.api}/-/healthz") == (200, "success")


def test_data_plane_works_behind_the_token_and_never_sees_it(secured: Kubeserve) -> None:
    """Proxies and replicas long-poll the controller without the admin token; user code in a
    replica does not inherit it from ``kubeserve start``'s environment."""
    probe = {"name": "probe", "route_prefix": "/probe", "import_path": "e2e_probe:app"}
    assert secured.put([HELLO, probe])[0] == 200
    secured.wait_app("hello")
    secured.wait_app("probe")
    try:
        assert http("GET", f"{secured.proxy}/hello") == (200, "hello, world\n")
        status, body = http("GET", f"{secured.proxy}/probe")
        assert status == 200
        assert "KUBESERVE_AUTH_TOKEN" not in body["env"]
        assert TOKEN not in str(body)
    finally:
        secured.shutdown()


def test_kubeserve_client_commands_send_the_token(secured: Kubeserve, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    by_env = kubeserve_cli("status", "-a", secured.api, env={"KUBESERVE_AUTH_TOKEN": TOKEN})
    assert by_env.returncode == 0, by_env.stderr
    by_file = kubeserve_cli("config", "-a", secured.api, "--auth-token-file", str(token_file))
    assert by_file.returncode == 0, by_file.stderr
    without = kubeserve_cli("status", "-a", secured.api)
    assert without.returncode == 1
    assert "HTTP 401" in without.stderr and "KUBESERVE_AUTH_TOKEN" in without.stderr


def test_start_refuses_a_non_loopback_address_without_a_token(tmp_path: Path) -> None:
    result = kubeserve_cli(
        "start",
        "--dashboard-host",
        "0.0.0.0",
        "--dashboard-port",
        str(free_port()),
        "--state-dir",
        str(tmp_path),
    )
    assert result.returncode == 2
    assert "without authentication" in result.stderr
    assert "--auth-token-file" in result.stderr


@pytest.mark.parametrize("token", ["x", "0123456789abcdef", "a" * 64, "short-pass-phrase"])
def test_start_refuses_a_weak_token_on_a_non_loopback_address(tmp_path: Path, token: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    result = kubeserve_cli(
        "start",
        "--dashboard-host",
        "0.0.0.0",
        "--dashboard-port",
        str(free_port()),
        "--auth-token-file",
        str(token_file),
        "--state-dir",
        str(tmp_path),
    )
    assert result.returncode == 2, result.stderr
    assert "needs at least 128" in result.stderr
    assert len(token) < 2 or token not in result.stderr  # never echoed


def test_token_strength_is_estimated_from_length_and_alphabet() -> None:
    from kubeserve.api.security import token_bits, weak_token_problem

    assert weak_token_problem("0123456789abcdef0123456789abcdef") is None  # 32 hex digits
    assert weak_token_problem("Zm9vYmFyYmF6cXV4MTIzNDU2") is None  # 24 base64url characters
    assert token_bits("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") < 8
    assert weak_token_problem("hunter2") is not None


def test_a_request_without_a_host_header_is_refused_against_dns_rebinding(
    kubeserve: Kubeserve,
) -> None:
    import socket

    port = int(kubeserve.api.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /api/serve/applications/ HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.split(b" ", 2)[1] == b"403", answer[:200]
    assert b"DNS rebinding" in answer and b"missing" in answer


def test_start_refuses_an_empty_token_file(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    result = kubeserve_cli("start", "--auth-token-file", str(empty), "--state-dir", str(tmp_path))
    assert result.returncode != 0
    assert "is empty" in result.stderr


# --------------------------------------------------------------------------- Host check


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "LOCALHOST:1", "[::1]", "[::1]:8265", "127.0.0.1:80"]
)
def test_loopback_host_names_are_answered(kubeserve: Kubeserve, host: str) -> None:
    status, _ = http("GET", f"{kubeserve.api}/api/ray/version", headers={"Host": host})
    assert status == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8265", "127.0.0.1.evil.example", "10.0.0.1", "[::2]"]
)
def test_other_host_names_are_refused_against_dns_rebinding(
    kubeserve: Kubeserve, host: str
) -> None:
    status, body = http("GET", f"{kubeserve.api}/api/serve/applications/", headers={"Host": host})
    assert status == 403
    assert "DNS rebinding" in body["error"]
    assert body["details"][0]["loc"] == ["header", "Host"]


# --------------------------------------------------------------------------- HTTP semantics


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/api/serve/applications/", "DELETE,GET,HEAD,PUT"),
        ("PATCH", "/api/serve/deployments", "DELETE,GET,HEAD,PUT"),
        ("PUT", "/api/ray/version", "GET,HEAD"),
        ("DELETE", "/api/serve/deployments/status", "GET,HEAD"),
    ],
)
def test_wrong_method_is_405_with_allow(
    kubeserve: Kubeserve, method: str, path: str, allowed: str
) -> None:
    request = urllib.request.Request(f"{kubeserve.api}{path}", method=method, data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 405
    assert info.value.headers["Allow"] == allowed
    assert method in info.value.read().decode()


def test_api_type_filters_and_is_validated_like_ray(clean_kubeserve: Kubeserve) -> None:
    ks = clean_kubeserve
    assert ks.put([HELLO])[0] == 200
    ks.wait_app("hello")
    url = f"{ks.api}/api/serve/applications/"
    for value in ("declarative", "DECLARATIVE", "Declarative"):
        status, body = http("GET", f"{url}?api_type={value}")
        assert (status, list(body["applications"])) == (200, ["hello"])
    status, body = http("GET", f"{url}?api_type=imperative")
    assert (status, body["applications"]) == (200, {})
    assert list(http("GET", f"{url}?api_type=")[1]["applications"]) == ["hello"]
    for bad in ("unknown", "both", "declarative "):
        status, body = http("GET", f"{url}?api_type={bad.replace(' ', '%20')}")
        assert status == 400, bad
        assert body["details"][0]["loc"] == ["query", "api_type"]
