"""Resident memory of the data plane after load: the proxy and each no-op replica of
``kubeserve start`` (the applications of ``benchmarks/compare_apps.py``), after load.

    .venv/bin/python benchmarks/rss.py [TREE] [--apps noop,async_noop,chain] [--seconds 5]

Each application is loaded through the proxy with ``wrk -t1 -c16`` for ``--seconds``; then
``VmRSS`` is read from ``/proc/PID/status`` (resident memory hardly depends on how busy the
machine is: one run is a figure). Which modules a process loads is what
``tests/unit/runtime/test_replica_imports.py`` pins down.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from compare_trees import tree_kubeserve

HERE = Path(__file__).resolve().parent


def rss_mib(pid: int) -> float:
    """The resident memory of ``pid`` in MiB (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for {pid}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", nargs="?", default=str(HERE.parent))
    parser.add_argument("--apps", default="noop,async_noop,chain")
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    apps = args.apps.split(",")
    with tree_kubeserve(Path(args.tree).resolve(), apps, "rss", with_nginx=False) as setups:
        for app in apps:
            setup = setups[f"{app} via proxy"]
            subprocess.run(
                ["wrk", "-t1", "-c16", f"-d{args.seconds}s", setup.url],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        proxy = setups[f"{apps[0]} via proxy"].pids[0]
        print(f"proxy            pid {proxy:>7}  {rss_mib(proxy):6.1f} MiB")
        for app in apps:
            for pid in setups[f"{app} via proxy"].pids[1:]:
                print(f"replica {app:<8} pid {pid:>7}  {rss_mib(pid):6.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
