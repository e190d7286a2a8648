"""``import ray`` found on ``PYTHONPATH`` (:mod:`kubeserve.compat.pythonpath`): hands over to
kubeserve's meta-path finder and replaces itself.

Imported as ``ray``, this module installs :class:`~kubeserve.sdk.ray_namespace.RayNamespaceFinder`
and puts ``kubeserve.compat.ray`` in ``sys.modules["ray"]``, which the import system then returns
for this very import; every later ``ray.*`` import is answered by the finder, exactly as in
``python -m kubeserve.compat script.py``. So there is one ``ray`` module per process, whichever
door the script came in by.
"""

from __future__ import annotations

import importlib
import sys

from kubeserve.sdk import ray_namespace

if __name__ == "ray":
    del sys.modules["ray"]  # this stand-in: install() refuses a ray that is not kubeserve's
    ray_namespace.install()
    sys.modules["ray"] = importlib.import_module("ray")
