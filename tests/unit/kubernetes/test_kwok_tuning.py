"""The kwok tier's control-plane levers (``KUBESERVE_KWOK_TUNING``): all by default, ``none``
for the cluster untuned, an unknown name refused with the name in the message."""

from __future__ import annotations

import pytest

from support.kwok_cluster import TUNING_LEVERS, tuning


def test_every_lever_is_on_unless_the_variable_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBESERVE_KWOK_TUNING", raising=False)
    assert tuning() == frozenset(TUNING_LEVERS)
    monkeypatch.setenv("KUBESERVE_KWOK_TUNING", "none")
    assert tuning() == frozenset()
    monkeypatch.setenv("KUBESERVE_KWOK_TUNING", " gogc ,")
    assert tuning() == frozenset({"gogc"})


def test_an_unknown_lever_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBESERVE_KWOK_TUNING", "gogc,fsync")
    with pytest.raises(ValueError, match="fsync"):
        tuning()
