"""A folder to put on ``PYTHONPATH`` so that a plain ``python script.py`` imports kubeserve's
``ray``: ``PYTHONPATH=$(python -m kubeserve.compat --pythonpath) python script.py``.

It holds one package, ``ray``, whose only work is to hand over to kubeserve's finder (see
:mod:`kubeserve.compat.pythonpath.ray`). Nothing else of kubeserve is reachable through it.
"""

from __future__ import annotations

from pathlib import Path

#: the folder that holds the ``ray`` stand-in (this package's own folder)
FOLDER = str(Path(__file__).resolve().parent)
