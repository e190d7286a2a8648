"""``python -m kubeserve.runtime.proxy``: the proxy process (see :mod:`.command`)."""

from kubeserve.runtime.proxy.command import main

if __name__ == "__main__":
    raise SystemExit(main())
