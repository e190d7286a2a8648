"""``kubeserve._native``, the replica's per-request path in compiled code, when it is there.

The extension (crate ``native/pyext``, built by ``make native`` into
``kubeserve/_native.abi3.so``) implements the sealed frames of
:mod:`kubeserve.runtime.sealing` with the proxy's own Rust code: same wire bytes, same MACs, same
errors. It is optional: without it (no Rust toolchain where kubeserve was installed), or with
``KUBESERVE_PURE_PYTHON=1`` in the environment (to test and measure the pure Python path), every
module that could use it runs its Python implementation instead.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["NATIVE", "PURE_PYTHON_ENV"]

#: Set to ``1``: the Python implementations serve even where the extension is built.
PURE_PYTHON_ENV = "KUBESERVE_PURE_PYTHON"


def _load() -> ModuleType | None:
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        return None
    try:
        from kubeserve import _native
    except ImportError:
        return None
    return _native


#: The extension module, or None when the Python implementations serve.
NATIVE = _load()
