"""``python -m kubeserve.compat script.py [args...]``: run a Ray Serve driver script (one calling
``serve.run``, ``serve.status``, handles...) with ``import ray`` resolving to kubeserve, against the
instance at ``KUBESERVE_ADDRESS``.

``python -m kubeserve.compat --pythonpath`` prints the folder to put on ``PYTHONPATH`` for a plain
``python script.py`` to import kubeserve's ``ray`` the same way
(:mod:`kubeserve.compat.pythonpath`).
"""

from __future__ import annotations

import os
import runpy
import sys

from kubeserve.sdk import ray_namespace


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m kubeserve.compat SCRIPT.py [ARGS...] | --pythonpath")
    if sys.argv[1] == "--pythonpath":
        from kubeserve.compat.pythonpath import FOLDER

        print(FOLDER)
        return
    ray_namespace.install()
    sys.argv = sys.argv[1:]
    # as `python SCRIPT.py` does: the script's folder comes first on the import path (so a
    # module beside it imports), where `-m` put the working directory
    script = os.path.abspath(sys.argv[0])
    sys.path[0] = os.path.dirname(script)
    # by its absolute path, as `python SCRIPT.py` runs it: the file its code and tracebacks name
    # (in a replica too, where the code arrives pickled) is the same from any directory
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
