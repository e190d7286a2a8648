from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.kubeserve_start import Kubeserve, running_kubeserve


@pytest.fixture(scope="module")
def kubeserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubeserve]:
    """One real ``kubeserve start`` per test module; each test leaves it with nothing deployed."""
    with running_kubeserve(tmp_path_factory.mktemp("kubeserve")) as server:
        yield server


@pytest.fixture
def clean_kubeserve(kubeserve: Kubeserve) -> Iterator[Kubeserve]:
    yield kubeserve
    kubeserve.shutdown()
