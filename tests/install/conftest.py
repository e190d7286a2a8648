"""Fixtures of the install tests: the Helm binaries the Makefile provides (``make helm``)."""

from __future__ import annotations

import pytest

from support.kubeserve_install import find_helm, find_helm3


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.skip("no helm binary: run `make helm` (or `make test`)")
    return path


@pytest.fixture(scope="session", params=["helm4", "helm3"])
def any_helm(request: pytest.FixtureRequest) -> str:
    """Each Helm major version the chart must work with (Helm 3 only when a Helm 3 is provided)."""
    path = find_helm() if request.param == "helm4" else find_helm3()
    if path is None:
        pytest.skip(f"no {request.param} binary: run `make helm` (or `make test`)")
    return path
