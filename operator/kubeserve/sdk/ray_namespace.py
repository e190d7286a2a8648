"""Makes ``import ray`` resolve to kubeserve's Ray compatibility layer inside kubeserve's processes.

A Ray Serve application module starts with ``from ray import serve``. kubeserve runs such modules
unchanged without installing a distribution named ``ray``: :func:`install` puts a finder first on
:data:`sys.meta_path` that answers every ``ray`` and ``ray.*`` import with the module of the same
name under :data:`COMPAT_PACKAGE` (``ray.serve.handle`` is ``kubeserve.compat.ray.serve.handle``,
the same module object under two names, so classes pickle under their kubeserve names).

Why a meta-path finder rather than a directory put first on ``sys.path``: a finder at the front of
``sys.meta_path`` is asked before any path entry, so neither a real Ray in site-packages, nor a
``PYTHONPATH`` or ``working_dir`` the runtime_env prepends, nor user code editing ``sys.path`` can
shadow it; and nothing is written to disk or leaks into the user's own environment outside
kubeserve's processes. A ``ray`` submodule kubeserve does not provide fails at import with
:class:`ModuleNotFoundError` naming it, instead of silently loading half of a real Ray.

Invariant: :func:`install` is idempotent and must run before user code is imported; it refuses
(:class:`RuntimeError`) when a real ``ray`` was already imported in the process, because two
``ray`` modules in one process would make ``isinstance`` checks lie.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

from kubeserve.compat import ray as _compat_ray

__all__ = ["COMPAT_PACKAGE", "RayNamespaceFinder", "install", "installed"]

#: The package whose modules ``ray.*`` names resolve to. Imported, not named by a string: this is
#: the one import from the bottom of the layers to the top, declared as such in ``pyproject.toml``
#: (the package itself imports nothing of kubeserve; ``ray.serve`` loads when ``ray`` code asks).
COMPAT_PACKAGE = _compat_ray.__name__


class _AliasLoader:
    """Loads ``ray.x`` as the already importable ``kubeserve.compat.ray.x`` module object (a
    loader by protocol: ``importlib.abc`` would load ``importlib.resources`` and ``tempfile``
    into every replica)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def load_module(self, fullname: str) -> ModuleType:
        """The import system's legacy entry (it calls :meth:`create_module` instead)."""
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec on the module; its own spec stays authoritative.
        module.__spec__ = self.own_spec


class RayNamespaceFinder:
    """Answers ``ray`` and ``ray.*`` with kubeserve's compatibility modules (see the module doc)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "ray" and not fullname.startswith("ray."):
            return None
        compat = COMPAT_PACKAGE + fullname[len("ray") :]
        try:
            found = importlib.util.find_spec(compat)
        except ModuleNotFoundError:
            found = None
        if found is None:
            # the table of Ray Serve's public names kubeserve leaves out, with their reasons
            table = importlib.import_module(f"{COMPAT_PACKAGE}.not_provided")
            why = table.reason(fullname)
            if why is not None:
                raise table.NotProvidedError(
                    f"{fullname} is not provided by kubeserve: {why}", name=fullname
                )
            raise ModuleNotFoundError(
                f"{fullname} is part of Ray, which kubeserve does not provide: kubeserve runs "
                "Ray Serve applications (ray.serve and its public modules) without Ray itself",
                name=fullname,
            )
        is_package = found.submodule_search_locations is not None
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(compat), origin=found.origin, is_package=is_package
        )


def installed() -> bool:
    return any(isinstance(finder, RayNamespaceFinder) for finder in sys.meta_path)


def install() -> None:
    """Put :class:`RayNamespaceFinder` first on ``sys.meta_path`` (idempotent).

    Raises :class:`RuntimeError` when a ``ray`` that is not kubeserve's is already imported.
    """
    loaded = sys.modules.get("ray")
    if loaded is not None and not loaded.__name__.startswith(COMPAT_PACKAGE):
        raise RuntimeError(
            "a real Ray is already imported in this process; kubeserve's ray namespace must be "
            "installed before anything imports ray"
        )
    if not installed():
        sys.meta_path.insert(0, RayNamespaceFinder())
