"""``python -m kubeserve.cli``: the ``kubeserve`` command, as tests and benchmarks start it."""

import contextlib
import sys

from kubeserve.cli import main

with contextlib.suppress(KeyboardInterrupt):
    sys.exit(main())
