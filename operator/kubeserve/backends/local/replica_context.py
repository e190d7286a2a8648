"""What every process the local controller starts needs from its instance: one
:class:`ReplicaContext`, built once by the controller and shared by the proxy and every deployment.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kubeserve.backends.local import processes
from kubeserve.backends.local.capacity import Capacity
from kubeserve.backends.local.limit_enforcement import Enforcement
from kubeserve.backends.local.process_records import ProcessRecords
from kubeserve.control.replica_limits import DEFAULT_MAX_PROCESSES
from kubeserve.runtime import channel, logs, metrics
from kubeserve.runtime.limits import RequestLimits
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath

#: Where the metrics directories of instances live when the machine has one: memory.
SHARED_MEMORY = Path("/dev/shm")


def metrics_dir(state_dir: Path) -> Path:
    """The metrics directory of the instance whose state directory is ``state_dir``.

    In shared memory when there is some (``/dev/shm``), else ``<state dir>/metrics``. Every
    process of the instance writes its samples into memory-mapped files there (prometheus_client's
    multiprocess mode), and a page of such a file that a full disk cannot give kills the process
    with SIGBUS: on the state directory's disk, a full disk would take down the proxy and every
    replica at their next new sample, and keep them from starting again. The directory lives as
    long as the run (the controller empties it at start and removes it at close), so nothing is
    lost by keeping it off the disk.
    """
    if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK | os.X_OK):
        digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:16]
        return SHARED_MEMORY / f"kubeserve-{os.getuid()}-{digest}"
    return state_dir / "metrics"


@dataclass(frozen=True)
class ReplicaContext:
    """What a deployment needs from its surroundings (shared by every deployment of an instance)."""

    session: aiohttp.ClientSession
    controller_url: str
    capacity: Capacity
    #: the instance's state directory (0700), marking its children (``processes.INSTANCE_ENV``)
    state_dir: Path
    log_dir: Path
    base_dir: str
    wake: Callable[[], None]
    #: the instance's data-plane secret (kubeserve.runtime.channel) and the file holding it
    secret: bytes
    secret_file: Path
    #: where running replicas and the proxy are recorded for the next ``kubeserve start``
    records: ProcessRecords
    #: what clients may send (``kubeserve start --max-body-bytes``...): proxy and replicas
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    #: bytes per log file and rotated files kept (``kubeserve start --log-max-bytes``...)
    log_rotation: tuple[int, int] = (logs.DEFAULT_LOG_BYTES, logs.DEFAULT_LOG_BACKUPS)
    #: replicas and the proxy get a parent-death signal (see ``LocalSettings.data_plane_outlives``)
    die_with_parent: bool = False
    #: how replicas are held to their memory and process limits (``None``: they are not)
    limits: Enforcement | None = None
    #: processes (threads included) one replica may run (``--replica-max-processes``)
    max_processes: int = DEFAULT_MAX_PROCESSES
    #: what serves the proxy's requests (``LocalSettings.data_path``)
    data_path: DataPath = DEFAULT_DATA_PATH

    def data_plane_env(self) -> dict[str, str]:
        """What a proxy or replica needs in its environment to join the data plane."""
        return {channel.SECRET_FILE_ENV: str(self.secret_file)}

    def log_env(self, log_path: Path) -> dict[str, str]:
        """What tells a replica or proxy to write (and rotate) its own log file."""
        max_bytes, backups = self.log_rotation
        return {
            logs.LOG_FILE_ENV: str(log_path),
            logs.LOG_BYTES_ENV: str(max_bytes),
            logs.LOG_BACKUPS_ENV: str(backups),
        }

    def child_env(self, extra: Mapping[str, str], python_path: Sequence[str]) -> dict[str, str]:
        """The environment of a child process of this instance (see :mod:`processes`)."""
        marked = {
            **extra,
            processes.INSTANCE_ENV: str(self.state_dir),
            metrics.MULTIPROC_ENV: str(self.metrics_dir),
        }
        return processes.child_env(marked, python_path, self.base_dir)

    @property
    def metrics_dir(self) -> Path:
        """Where the instance's proxy and replicas write their metrics (``GET /metrics``)."""
        return metrics_dir(self.state_dir)
