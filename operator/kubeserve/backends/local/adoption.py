"""What an earlier ``kubeserve start`` on this state directory left serving, found and checked.

A ``kubeserve start`` killed outright leaves its replicas and proxy running (the data plane
outlives its control plane). The next one reads their records (:mod:`process_records`) and adopts
a process only when it is provably the one recorded:

* it runs, with the recorded PID *and* start time (a PID reused by a stranger never matches);
* a replica answers its health check over the authenticated channel at the recorded port, and
  the channel's handshake names the recorded replica id: its identity, address and applied
  ``user_config`` version (in the health answer) are the replica's own word, under the
  instance's secret;
* the proxy's start arguments (address and options) are compared with the wanted ones when the
  serving layer is reconciled (:class:`~kubeserve.backends.local.proxy_process.ProxyProcess`).

What fails a check is killed with its process group; what passes is handed to its deployment,
which keeps it, reconfigures it, or stops it when the desired state no longer wants it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
from dataclasses import dataclass

from kubeserve.backends.local import processes
from kubeserve.backends.local.process_records import ProcessRecords, ProxyRecord, ReplicaRecord
from kubeserve.runtime import channel, wire

log = logging.getLogger(__name__)

#: How long a replica of an earlier run may take to answer its health check.
_CHECK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AdoptedReplica:
    record: ReplicaRecord
    proc: processes.AdoptedProcess


@dataclass(frozen=True)
class AdoptedProxy:
    record: ProxyRecord
    proc: processes.AdoptedProcess
    #: a copy of its listening socket (``pidfd_getfd``), for its successors; None: not available
    listener: socket.socket | None


async def find_replicas(records: ProcessRecords, secret: bytes) -> list[AdoptedReplica]:
    """The recorded replicas that still run and prove who they are; the others' records go."""
    stored = records.replicas()
    found = await asyncio.gather(*(_check_replica(record, secret) for record in stored))
    for record, adopted in zip(stored, found, strict=True):
        if adopted is None:
            records.remove_replica(record.replica_id)
    return [adopted for adopted in found if adopted is not None]


async def _check_replica(record: ReplicaRecord, secret: bytes) -> AdoptedReplica | None:
    proc = processes.AdoptedProcess.find(record.pid, record.start_time)
    if proc is None:
        return None
    try:
        status, answer = await channel.request(
            "127.0.0.1",
            record.port,
            "GET",
            wire.HEALTHZ_PATH,
            secret,
            record.replica_id,
            timeout_s=_CHECK_TIMEOUT_S,
        )
        problem = "" if status == 200 else f"its health check answered HTTP {status}"
    except (OSError, TimeoutError) as exc:
        problem = f"it does not answer as replica {record.replica_id}: {exc!r}"
    if not problem:  # the user_config it applied, in its own word when it gives it
        applied = wire.applied_user_config(answer) or record.user_config_version
        return AdoptedReplica(dataclasses.replace(record, user_config_version=applied), proc)
    log.warning("not adopting replica %s (pid %d): %s", record.replica_id, record.pid, problem)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()
    processes.kill_group(proc.pid)
    return None


def find_proxy(records: ProcessRecords) -> AdoptedProxy | None:
    """The recorded proxy if it still runs (its record goes otherwise), with a copy of its
    listening socket when the kernel gives one."""
    record = records.proxy()
    if record is None:
        return None
    proc = processes.AdoptedProcess.find(record.pid, record.start_time)
    if proc is None:
        records.remove_proxy()
        return None
    return AdoptedProxy(record, proc, _listener_of(proc, record.listen_fd))


def _listener_of(proc: processes.AdoptedProcess, fd: int) -> socket.socket | None:
    copy = proc.pidfd_getfd(fd)
    if copy is None:
        return None
    try:
        listener = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return None
    if listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return listener
    listener.close()
    return None


def stop_unwanted(
    adopted: list[AdoptedReplica], records: ProcessRecords, tasks: set[asyncio.Task[None]]
) -> None:
    """Stop adopted replicas the desired state has no place for (gracefully, as a replaced
    replica is); the stopping tasks are kept in ``tasks`` until done."""
    for replica in adopted:
        log.info("stopping replica %s of an earlier run: not wanted", replica.record.replica_id)
        records.remove_replica(replica.record.replica_id)
        task = asyncio.ensure_future(_stop(replica.proc))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _stop(proc: processes.AdoptedProcess) -> None:
    await processes.terminate(proc, _STOP_TIMEOUT_S)


#: How long a replica of an earlier run that is not wanted may drain (its deployment's own
#: ``graceful_shutdown_timeout_s`` may be gone with its config): Ray's default.
_STOP_TIMEOUT_S = 20.0
