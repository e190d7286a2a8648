"""Test application that goes over its limits on request: memory (``Hog``) and processes
(``Forker``). Everything it does is bounded, so it cannot harm the machine when a limit is not
enforced: at most ``HOG_CAP_MIB`` of memory, at most ``FORK_CAP`` children (of the 10,000 the
test asks for), each exiting after ``CHILD_LIFETIME_S``."""

import os
import time

from kubeserve import Request, deployment

HOG_CAP_MIB = 600
FORK_CAP = 1_000
CHILD_LIFETIME_S = 60.0


@deployment(ray_actor_options={"memory": 200 * 1024**2}, health_check_period_s=0.5)
class Hog:
    def __init__(self) -> None:
        self.held: list[bytes] = []

    def __call__(self, request: Request) -> str:
        """``?mib=N``: allocate and touch N MiB more (10 MiB at a time), and keep it."""
        wanted = min(int(request.query_params.get("mib", "0")), HOG_CAP_MIB)
        for _ in range(wanted // 10):
            self.held.append(b"x" * (10 * 1024**2))
        return f"holding {len(self.held) * 10} MiB in pid {os.getpid()}"


@deployment
class Forker:
    def __call__(self, request: Request) -> dict[str, object]:
        """``?n=N``: start up to N sleeping processes (each its own session, as a fork loop that
        tries to escape its process group); answers how many started and why it stopped."""
        wanted = min(int(request.query_params.get("n", "0")), FORK_CAP)
        started, error = 0, ""
        for _ in range(wanted):
            try:
                pid = os.fork()
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc}"
                break
            if pid == 0:  # the child: no Python cleanup, no inherited server
                try:
                    os.setsid()
                    time.sleep(CHILD_LIFETIME_S)
                finally:
                    os._exit(0)
            started += 1
        return {"started": started, "error": error, "pid": os.getpid()}


hog = Hog.bind()
forker = Forker.bind()
