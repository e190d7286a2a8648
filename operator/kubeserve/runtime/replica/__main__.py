"""``python -m kubeserve.runtime.replica``: the replica process (see :mod:`.command`)."""

import sys

from kubeserve.runtime.replica.command import main

if __name__ == "__main__":
    sys.exit(main())
