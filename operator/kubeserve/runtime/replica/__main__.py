"""``python -m kubeserve.runtime.replica``: the replica process (see :func:`.server.main`)."""

import sys

from kubeserve.runtime.replica.server import main

if __name__ == "__main__":
    sys.exit(main())
