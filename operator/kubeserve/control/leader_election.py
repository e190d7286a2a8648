"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection`` does
it: the decisions, without I/O (the loop that reads and writes the Lease is
:mod:`kubeserve.backends.kubernetes.leader`).

Invariants (with :class:`LeaseTiming`'s ``lease_duration > renew_deadline > retry_period``):

* A candidate takes the Lease only when it holds it already, nobody holds it, or the record it
  observes has not *changed* for ``lease_duration`` by its own monotonic clock (client-go's
  "observed time": no clock of another machine is trusted, only the fact that the holder stopped
  renewing). Every write is a compare-and-swap on the Lease's resourceVersion, so of two
  candidates at most one succeeds.
* A leader may write only while its last successful renewal is younger than ``renew_deadline``
  (:meth:`Tenure.may_write`). A leader that cannot renew (partitioned, API server slow, paused)
  therefore stops writing at least ``lease_duration - renew_deadline`` before any candidate may
  take over: two processes never both write, even while both still believe they lead.
* A late renewal only *pauses* the leader's writes (:attr:`TermState.PAUSED`): its term ends
  when no renewal succeeded for ``lease_duration`` (the moment another replica may take the
  Lease, :attr:`TermState.ENDED`) or when another holder is seen in the Lease. A renewal that
  succeeds in between opens the fence again: it was a compare-and-swap over this leader's own
  last write, so nobody else wrote the Lease meanwhile.
* Renewals go out every retry period even while earlier ones are unanswered (at most
  :data:`RENEWALS_IN_FLIGHT`): on an API server answering in seconds the freshest success counts,
  from the time its request was *sent* (:meth:`Tenure.renewed`); an answer to an older request
  never moves it back, and an answer to a request sent before the term ended never starts a new
  one (:attr:`Tenure.epoch`).
* A leader that stops cleanly releases the Lease (holder emptied), so the next takes over at its
  next retry instead of after ``lease_duration``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

#: the Lease annotation holding the leader's admin URL (its pod address), where the other
#: replicas forward what only the leader can use (the pods' load reports)
LEADER_URL_ANNOTATION = "kubeserve.io/leader-url"

#: renewals (or attempts) of one process unanswered at once: a new one goes out every retry
#: period, unless this many are still waiting for the API server
RENEWALS_IN_FLIGHT = 3


@dataclass(frozen=True)
class LeaseTiming:
    """client-go's defaults (15 s, 10 s, 2 s) scaled down so a killed leader is replaced within
    ``lease_duration + retry_period`` (10 s) plus the new leader's start."""

    #: how long a candidate waits after the record last changed before taking the Lease
    lease_duration_s: float = 8.0
    #: how long a leader keeps writing after its last successful renewal
    renew_deadline_s: float = 6.0
    #: the period of renewals (leader) and of attempts (candidates)
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s > 0:
            raise ValueError(
                "leader election needs lease_duration > renew_deadline > retry_period > 0, got "
                f"{self.lease_duration_s}, {self.renew_deadline_s}, {self.retry_period_s}"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease that election reads and writes (``spec`` plus the leader's URL)."""

    holder: str = ""
    lease_duration_s: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    leader_url: str = ""

    @classmethod
    def of(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        annotations = lease.get("metadata", {}).get("annotations") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            leader_url=annotations.get(LEADER_URL_ANNOTATION, ""),
        )

    def spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder or None,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True)
class Observation:
    """A candidate's view of the Lease: the record it last read and when (its monotonic clock)
    it last saw that record *change*."""

    record: LeaseRecord
    changed_at: float

    def seen(self, record: LeaseRecord, now: float) -> Observation:
        return self if record == self.record else Observation(record, now)

    def held_by_another(self, identity: str, timing: LeaseTiming, now: float) -> bool:
        """Whether someone else holds the Lease and has renewed it recently enough."""
        holder = self.record.holder
        return (
            bool(holder)
            and holder != identity
            and now < self.changed_at + _duration(self.record, timing)
        )


def _duration(record: LeaseRecord, timing: LeaseTiming) -> float:
    """The lease duration to wait out: the holder's own (it may be configured differently)."""
    return (
        float(record.lease_duration_s) if record.lease_duration_s > 0 else timing.lease_duration_s
    )


def claim(
    current: LeaseRecord, identity: str, leader_url: str, timing: LeaseTiming, stamp: str
) -> LeaseRecord:
    """The record to write to take or renew the Lease at ``stamp`` (MicroTime), given the
    ``current`` one (the caller checked :meth:`Observation.held_by_another` first)."""
    renewing = current.holder == identity
    return LeaseRecord(
        holder=identity,
        # rounded up: another replica waiting longer than this one's fence assumes is safe
        lease_duration_s=math.ceil(timing.lease_duration_s),
        acquire_time=current.acquire_time if renewing else stamp,
        renew_time=stamp,
        transitions=current.transitions if renewing else current.transitions + 1,
        leader_url=leader_url,
    )


def release(current: LeaseRecord, stamp: str) -> LeaseRecord:
    """The record a leader that stops writes: nobody holds it, so a candidate takes it at once."""
    return replace(current, holder="", lease_duration_s=1, renew_time=stamp, leader_url="")


class TermState(Enum):
    """Where a leader's term stands at a given time (:meth:`Tenure.state`)."""

    #: renewed within ``renew_deadline``: the fence is open
    WRITING = "writing"
    #: the last renewal is older than ``renew_deadline`` but younger than ``lease_duration``:
    #: the fence is shut, the term goes on (a renewal may still succeed)
    PAUSED = "paused"
    #: no term, or no renewal for ``lease_duration`` (another replica may take the Lease)
    ENDED = "ended"


@dataclass
class Tenure:
    """A leader's term as the leader itself sees it: the monotonic time of its freshest
    successful renewal (when that request was sent), or None while it does not lead."""

    timing: LeaseTiming
    renewed_at: float | None = None
    #: terms ended so far: a renewal sent in an earlier epoch counts for nothing
    epoch: int = 0
    #: times the fence shut for a renewal found late (a pause, whether the term resumed or ended)
    fence_shuts: int = 0

    def renewed(self, sent: float, now: float, epoch: int | None = None) -> bool:
        """A renewal sent at ``sent`` (during ``epoch``; None: the current one) succeeded, its
        answer read at ``now``: whether it counts (the API server may have stored it any time
        after ``sent``, so that is the time that counts; an answer to an older request than the
        freshest success, or to one sent before the term ended, changes nothing)."""
        if epoch is not None and epoch != self.epoch:
            return False
        renewed_at = self.renewed_at
        if renewed_at is not None and sent <= renewed_at:
            return False
        if renewed_at is not None and now >= renewed_at + self.timing.renew_deadline_s:
            self.fence_shuts += 1  # the fence had shut; this renewal opens it again
        self.renewed_at = sent
        return True

    def end(self, now: float) -> None:
        """The term ends (or is given up) at ``now``: the fence shuts at once."""
        renewed_at = self.renewed_at
        if renewed_at is not None and now >= renewed_at + self.timing.renew_deadline_s:
            self.fence_shuts += 1  # it ended while paused: that pause counts
        self.renewed_at = None
        self.epoch += 1

    def state(self, now: float) -> TermState:
        renewed_at = self.renewed_at  # once: the elector's thread may end the term meanwhile
        if renewed_at is None or now >= renewed_at + self.timing.lease_duration_s:
            return TermState.ENDED
        if now < renewed_at + self.timing.renew_deadline_s:
            return TermState.WRITING
        return TermState.PAUSED

    def may_write(self, now: float) -> bool:
        renewed_at = self.renewed_at  # once: the elector's thread may end the term meanwhile
        return renewed_at is not None and now < renewed_at + self.timing.renew_deadline_s
