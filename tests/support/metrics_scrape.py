"""The admin API's ``GET /metrics`` of a ``kubeserve start``, read with prometheus_client's own
parser, as Prometheus would."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from support.common import http
from support.kubeserve_start import Kubeserve


def scrape(ks: Kubeserve) -> dict[str, list[tuple[dict[str, str], float]]]:
    """sample name -> [(labels, value)] of the admin API's ``GET /metrics``."""
    status, text = http("GET", f"{ks.api}/metrics")
    assert status == 200, text
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v for have, v in samples.get(name, []) if all(have.get(k) == x for k, x in labels.items())
    )
