"""Capture every public name of Ray 2.60's ``ray.serve`` and of its public submodules.

Run with the Ray 2.60 virtualenv (``make ray-client``; ``make ray-public-names`` does this)::

    ~/.cache/kubeserve/ray-2.60.0/bin/python tests/reference/ray-2.60/capture_public_names.py \
        > tests/reference/ray-2.60/public-names.json

What counts as public is Ray's own declaration, read from the source (not by importing it: some
modules need optional packages, e.g. ``ray.serve.llm`` needs vLLM's dependencies):

* a module is public when no part of its dotted name starts with ``_``, it is not under
  ``ray.serve.experimental`` or ``ray.serve.generated`` nor the CLI (``ray.serve.scripts``), and it
  declares ``__all__`` or defines at least one name decorated ``@PublicAPI``;
* its public names are its ``__all__`` together with the names it defines under ``@PublicAPI``
  and the module-level aliases of those (a ``@DeveloperAPI`` name counts only where an ``__all__``
  lists it, as ``ray.serve`` does).

``fields`` holds, for each public name that is a data class or pydantic model, its field names, and
for an enum its members' values: what a kubeserve stand-in must carry to be the same type.

Besides ``ray.serve``, two modules of Ray a Serve application imports follow the same rule:
``ray.util.metrics`` (the metrics classes ``ray.serve.metrics`` extends) and ``ray.exceptions``
(the errors a caller of a handle catches).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import importlib
import json
import pathlib
import sys

import ray

ROOT = pathlib.Path(ray.__file__).parent
EXCLUDED = ("ray.serve.experimental", "ray.serve.generated", "ray.serve.scripts")
EXTRA = ("ray.util.metrics", "ray.exceptions")


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _stability(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        for keyword in node.keywords:
            if keyword.arg == "stability" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
    return "stable"


def _module_names(path: pathlib.Path) -> dict[str, str] | None:
    """A module's public names, each with what makes it public; None for a private module."""
    tree = ast.parse(path.read_text(), str(path))
    listed: list[str] | None = None
    annotated: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert node.value is not None
                listed = list(ast.literal_eval(node.value))
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if _decorator_name(decorator) == "PublicAPI":
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    annotated[node.name] = f"{kind}, PublicAPI({_stability(decorator)})"
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            aliased = annotated.get(node.value.id)
            if aliased is not None:  # `default_autoscaling_policy = replica_queue_length_...`
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        annotated[target.id] = f"{aliased} (as {node.value.id})"
    if listed is None and not annotated:
        return None
    names = {name: "__all__" for name in listed or ()}
    names.update(annotated)
    return dict(sorted(names.items()))


def _fields(module: str, name: str) -> list[str] | None:
    """The fields of a data class, a pydantic model or an enum (its members' values); None for
    anything else, or when the module needs a package this venv lacks."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # gradio_integrations prints when it fails
            value = getattr(importlib.import_module(module), name)
    except Exception:  # an optional dependency (vLLM, celery, gradio...) is missing
        return None
    if not isinstance(value, type):
        return None
    if issubclass(value, enum.Enum):
        return sorted(str(member.value) for member in value)
    if dataclasses.is_dataclass(value):
        return sorted(field.name for field in dataclasses.fields(value))
    model_fields = getattr(value, "model_fields", None)
    if isinstance(model_fields, dict):
        return sorted(model_fields)
    return None


def _dotted(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def main() -> None:
    modules: dict[str, dict[str, str]] = {}
    candidates = [*sorted((ROOT / "serve").rglob("*.py"))]
    candidates += [ROOT / (extra.removeprefix("ray.").replace(".", "/") + ".py") for extra in EXTRA]
    for path in candidates:
        dotted = _dotted(path)
        parts = dotted.split(".")
        if any(p.startswith("_") for p in parts) or "tests" in parts:
            continue
        if dotted.startswith(EXCLUDED):
            continue
        names = _module_names(path)
        if names is not None:
            modules[dotted] = names
    fields = {
        f"{module}.{name}": found
        for module, names in modules.items()
        for name in names
        if (found := _fields(module, name)) is not None
    }
    json.dump(
        {"ray_version": ray.__version__, "modules": modules, "fields": fields},
        sys.stdout,
        indent=2,
        sort_keys=True,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
