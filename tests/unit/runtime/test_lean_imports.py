"""What the proxy and replicas use instead of heavier standard modules gives what those give."""

from __future__ import annotations

from http import HTTPStatus
from urllib.parse import urlsplit

import pytest

from kubeserve.runtime.discovery import controller_address
from kubeserve.runtime.http1 import REASONS


def test_reason_phrases_are_those_of_http_status() -> None:
    assert {s.value: s.phrase.encode("ascii") for s in HTTPStatus} == REASONS


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:39005",
        "http://127.0.0.1:39005/",
        "http://[::1]:8080/x",
        "http://Operator.NS.svc",
        "http://user@host:1?x=1#y",
        "http://host:1#f",
        "http://host/a:b",
        "no-scheme",
        "",
    ],
)
def test_the_controller_address_is_read_as_urlsplit_reads_it(url: str) -> None:
    split = urlsplit(url)
    assert controller_address(url) == (split.hostname or "127.0.0.1", split.port or 80)


def test_a_controller_port_that_is_no_number_is_refused() -> None:
    with pytest.raises(ValueError):
        controller_address("http://host:eighty")
