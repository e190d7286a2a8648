"""Restart pacing: how long a deployment waits before starting a replica after failures.

Every way a replica can fail to stay up (its process cannot be spawned, it exits before it is ready,
it exits on its own once serving) counts as one failure of its deployment; the deployment waits
:func:`restart_delay` before its next start. The streak is forgotten once a replica has served for
:data:`STABLE_AFTER_S`, or when the deployment's version changes (new code gets a fresh try).
Without this, a replica that dies at once is respawned as fast as Python starts (a log file a few
megabytes a second, a core kept busy).
"""

from __future__ import annotations

#: Delay after the first failure; doubled after each further one.
RESTART_BASE_S = 0.5
#: The longest wait between two starts, however many failures came before.
RESTART_CAP_S = 30.0
#: A replica serving this long ends a failure streak.
STABLE_AFTER_S = 10.0


def restart_delay(
    failures: int, base_s: float = RESTART_BASE_S, cap_s: float = RESTART_CAP_S
) -> float:
    """Seconds to wait before the next start after ``failures`` consecutive failures (0: none)."""
    if failures <= 0:
        return 0.0
    return min(cap_s, base_s * 2.0 ** min(failures - 1, 62))
