"""Every public name of Ray 2.60's ``ray.serve`` (and of ``ray.util.metrics``, ``ray.exceptions``)
is provided by kubeserve's ``ray``, or listed in :mod:`kubeserve.compat.ray.not_provided` with the
reason, which asking for it reports.

The names come from ``tests/reference/ray-2.60/public-names.json``, captured from Ray 2.60's
source by ``make ray-public-names``; no Ray is needed here. The probe runs in a process of its own:
the ``ray`` finder it installs is process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
SNAPSHOT = ROOT / "tests" / "reference" / "ray-2.60" / "public-names.json"

PROBE = r"""
import dataclasses, enum, importlib, json, sys
from kubeserve.sdk import ray_namespace
ray_namespace.install()
from kubeserve.compat.ray import not_provided as table

snapshot = json.load(open(sys.argv[1]))
report = {"unaccounted": [], "listed_but_provided": [], "wrong_error": [], "fields": [],
          "stale_entries": [], "whole_modules": [], "refused": 0, "provided": 0}
known = set()

def refused_with_reason(dotted, action):
    try:
        action()
    except table.NotProvidedError as exc:
        # an alias (ray.serve.api.run is ray.serve.run) reports the name it stands for
        why = table.reason(dotted) or table.reason(exc.name or "")
        if why is None or why not in str(exc) or (exc.name or "") not in str(exc):
            report["wrong_error"].append([dotted, str(exc)])
        report["refused"] += 1
        return True
    return False

for module, names in snapshot["modules"].items():
    known.add(module)
    known.update(f"{module}.{name}" for name in names)
    if table.reason(module) is not None:
        report["whole_modules"].append(module)
        if not refused_with_reason(module, lambda: importlib.import_module(module)):
            report["listed_but_provided"].append(module)
        continue
    mod = importlib.import_module(module)
    for name in names:
        dotted = f"{module}.{name}"
        why = table.reason(dotted)
        def import_it():
            exec(f"from {module} import {name}", {})
        try:
            getattr(mod, name)
        except table.NotProvidedError:
            refused_with_reason(dotted, import_it)
            continue
        except AttributeError:
            report["unaccounted"].append(dotted)
            continue
        report["provided"] += 1
        if why is not None:
            report["listed_but_provided"].append(dotted)

def fields_of(value):
    if isinstance(value, type) and issubclass(value, enum.Enum):
        return {str(member.value) for member in value}
    if dataclasses.is_dataclass(value):
        return {field.name for field in dataclasses.fields(value)}
    if isinstance(getattr(value, "model_fields", None), dict):
        return set(value.model_fields)
    if isinstance(value, type) and issubclass(value, tuple) and hasattr(value, "_fields"):
        return set(value._fields)  # a NamedTuple (kubeserve's ReplicaID, Ray's dataclass)
    return None

for dotted, wanted in snapshot["fields"].items():
    module, name = dotted.rsplit(".", 1)
    known.update(f"{dotted}.{field}" for field in wanted)
    if table.reason(dotted) is not None:
        continue
    have = fields_of(getattr(importlib.import_module(module), name))
    lacking = sorted(
        f for f in set(wanted) - (have or set()) if table.reason(f"{dotted}.{f}") is None
    )
    if have is None or lacking:
        report["fields"].append([dotted, lacking if have is not None else "not a data type"])

report["stale_entries"] = sorted(set(table.REASONS) - known)
print(json.dumps(report))
"""


def probe() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(SNAPSHOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_every_public_name_of_ray_serve_is_provided_or_refused_with_its_reason() -> None:
    report = probe()
    assert report["unaccounted"] == [], "neither provided nor listed in not_provided.REASONS"
    assert report["listed_but_provided"] == [], "provided: drop them from not_provided.REASONS"
    assert report["wrong_error"] == []
    assert report["stale_entries"] == [], "REASONS keys that no Ray 2.60 public name matches"
    assert report["provided"] > 100
    assert "ray.serve.llm" in report["whole_modules"]


def test_data_types_carry_ray_fields_and_enums_ray_members() -> None:
    assert probe()["fields"] == []
