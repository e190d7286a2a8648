"""The leader's Lease is kept by a thread of its own: an operator loop busy for longer than the
renew deadline (a thousand reconcile passes, say) keeps its term, and a term taken away ends the
fence at once, whatever the operator's loop is doing.

The elector runs in this process against the real API server of the kwok cluster; the operator's
loop is this test's, blocked on purpose: ``time.sleep`` in a coroutine holds it as a long pass
waiting on nothing would, and pure Python computing without a pause holds the GIL too, as a pass
rendering and diffing a thousand objects does (the elector's thread gets it only at the
interpreter's forced switches).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kubeserve.backends.kubernetes.leader import LeaderElector
from kubeserve.backends.kubernetes.main import _reconcile
from kubeserve.backends.kubernetes.operator import Operator, OperatorSettings
from kubeserve.control.leader_election import LeaseTiming
from kubeserve.runtime.kubernetes.client import KubeFenced
from support.kwok_cluster import KwokCluster

LEASE = "kubeserve-operator"
TIMING = LeaseTiming(lease_duration_s=8, renew_deadline_s=6, retry_period_s=2)


def renew_time(plane: KwokCluster, namespace: str) -> str:
    return str(plane.get("lease", LEASE, namespace)["spec"]["renewTime"])


async def leading(elector: LeaderElector, namespace: str) -> None:
    await elector.start()
    await asyncio.wait_for(elector.leading.wait(), 20)
    assert elector.may_write()


@pytest.fixture()
def elector(kwok: KwokCluster, kwok_namespace: str) -> LeaderElector:
    """An elector of the test's namespace, not started."""
    return LeaderElector(str(kwok.kubeconfig), kwok_namespace, LEASE, "busy", "http://busy", TIMING)


def test_a_leader_whose_loop_is_blocked_past_the_renew_deadline_keeps_writing(
    kwok: KwokCluster, kwok_namespace: str, elector: LeaderElector
) -> None:
    async def scenario() -> None:
        await leading(elector, kwok_namespace)
        before = renew_time(kwok, kwok_namespace)
        blocked_until = time.monotonic() + 2 * TIMING.renew_deadline_s
        fenced_at = []
        while time.monotonic() < blocked_until:  # the loop runs nothing else meanwhile
            if not elector.may_write():
                fenced_at.append(round(blocked_until - time.monotonic(), 1))
            time.sleep(0.1)  # noqa: ASYNC251 (holding the loop is the point)
        assert fenced_at == [], "the term ended while the operator's loop was busy"
        assert renew_time(kwok, kwok_namespace) != before
        await elector.stop()
        # a clean stop released the Lease
        assert not kwok.get("lease", LEASE, kwok_namespace)["spec"].get("holderIdentity")

    asyncio.run(scenario())


def _busy(seconds: float) -> int:
    """Pure Python for ``seconds``, holding the GIL but at the interpreter's switch interval (as
    a reconcile pass rendering and diffing a thousand objects does): no sleep, no I/O."""
    deadline, spins = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        spins += sum(i * i for i in range(200)) & 1
    return spins


def test_a_leader_whose_loop_is_cpu_bound_past_the_renew_deadline_keeps_its_fence_open(
    kwok: KwokCluster, kwok_namespace: str, elector: LeaderElector
) -> None:
    """The elector's thread renews while the operator's loop computes without a pause (the GIL
    held but for the interpreter's forced switches): the fence never shuts and renewals land."""

    async def scenario() -> None:
        await leading(elector, kwok_namespace)
        before = renew_time(kwok, kwok_namespace)
        fenced_at = []
        blocked_until = time.monotonic() + 2 * TIMING.renew_deadline_s
        while time.monotonic() < blocked_until:  # the loop runs nothing else meanwhile
            _busy(0.05)
            if not elector.may_write():
                fenced_at.append(round(blocked_until - time.monotonic(), 1))
        assert fenced_at == [], "the fence shut while the operator's loop was CPU-bound"
        assert elector.fence_shuts == 0
        assert renew_time(kwok, kwok_namespace) != before
        await elector.stop()

    asyncio.run(scenario())


def test_a_lease_taken_away_fences_a_leader_whose_loop_is_blocked(
    kwok: KwokCluster, kwok_namespace: str, elector: LeaderElector
) -> None:
    async def scenario() -> None:
        await leading(elector, kwok_namespace)
        take = {"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 3600}}
        kwok.kubectl(
            "patch", "lease", LEASE, "-n", kwok_namespace, "--type", "merge",
            "-p", json.dumps(take),
        )  # fmt: skip
        taken = time.monotonic()
        while elector.may_write():  # blocked: only the elector's thread can end the term
            assert time.monotonic() < taken + TIMING.retry_period_s + 3, "still writing"
            time.sleep(0.05)  # noqa: ASYNC251 (holding the loop is the point)
        # the operator's loop hears of it once it runs again
        await asyncio.wait_for(elector.lost.wait(), 5)
        assert not elector.leading.is_set()
        await elector.stop()
        assert kwok.get("lease", LEASE, kwok_namespace)["spec"]["holderIdentity"] == "intruder"

    asyncio.run(scenario())


def test_a_term_ending_while_a_pass_writes_stops_reconciling_not_the_process(
    kwok: KwokCluster, kwok_namespace: str, elector: LeaderElector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf, asked to stop at a term's end, re-raises the failure of every task created while it
    ran: a pass's write refused by the fence (the term is over) once took the whole operator down.
    Now the term's end stops kopf and the passes, and the process goes on as a follower."""
    monkeypatch.setenv("KUBECONFIG", str(kwok.kubeconfig))  # kopf's login
    settings = OperatorSettings(
        namespace=kwok_namespace,
        watch_namespaces=(kwok_namespace,),
        kubeconfig=str(kwok.kubeconfig),
    )

    async def scenario() -> None:
        operator = Operator(settings, elector)
        await operator.start()
        await leading(elector, kwok_namespace)
        stop = asyncio.Event()
        reconciling = asyncio.ensure_future(_reconcile(operator, stop, elector.lost))
        await asyncio.sleep(3)  # kopf is up
        assert operator.leading and not reconciling.done()
        assert operator.cluster is not None
        writer = operator.cluster.kube  # the passes' client, fenced by the Lease

        async def a_pass_writing_as_the_term_ends() -> None:
            await elector.lost.wait()
            await asyncio.sleep(1.5)  # its earlier requests, to a slow API server
            config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}
            await asyncio.gather(writer.create("ConfigMap", kwok_namespace, config))

        writing = asyncio.ensure_future(a_pass_writing_as_the_term_ends())
        take = {"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 3600}}
        kwok.kubectl(
            "patch", "lease", LEASE, "-n", kwok_namespace, "--type", "merge",
            "-p", json.dumps(take),
        )  # fmt: skip
        await asyncio.wait_for(asyncio.shield(reconciling), TIMING.retry_period_s + 15)
        assert reconciling.exception() is None
        assert not stop.is_set(), "the end of a term stopped the process"
        assert not operator.leading
        assert isinstance(writing.exception(), KubeFenced)  # refused, never sent
        names = kwok.kubectl("get", "configmap", "-n", kwok_namespace, "-o", "name").stdout
        assert "configmap/late" not in names
        await elector.stop()
        await operator.close()

    asyncio.run(scenario())


class SlowAnswers:
    """A TCP relay in front of the API server that hands every byte of its answers over
    ``delay_s`` late (the requests go through at once, TLS end to end): an API server answering
    in seconds, as one busy with a thousand applications does. ``delay_s`` may change."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        self.host, port = upstream.removeprefix("https://").rsplit(":", 1)
        self.port, self.delay_s = int(port), delay_s
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: Callable[[], float]
        ) -> None:
            chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

            async def deliver() -> None:
                while True:
                    due, chunk = await chunks.get()
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    if not chunk:
                        dst.close()
                        return
                    dst.write(chunk)
                    await dst.drain()

            delivering = asyncio.ensure_future(deliver())
            while chunk := await src.read(65536):
                chunks.put_nowait((time.monotonic() + delay(), chunk))
            chunks.put_nowait((time.monotonic() + delay(), b""))
            await delivering

        with contextlib.suppress(OSError):
            await asyncio.gather(
                pipe(reader, up_writer, lambda: 0.0), pipe(up_reader, writer, lambda: self.delay_s)
            )

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def test_renewals_answered_later_than_the_renew_deadline_keep_the_term(
    kwok: KwokCluster, kwok_namespace: str, tmp_path: Path
) -> None:
    """The API server slows down until every answer comes 4.5 s late (renew deadline 6 s, retry
    period 2 s): renewals answered one after another would have the freshest success 4.5 to 9 s
    old, and the fence shut most of the time (31% open, measured with them); sent every retry
    period, several in flight, the freshest success keeps the term and mostly the fence (75%)."""

    async def scenario() -> None:
        slow = SlowAnswers(kwok.server, 0.0)
        config = yaml.safe_load(kwok.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = await slow.start()
        kubeconfig = tmp_path / "slow.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        elector = LeaderElector(
            str(kubeconfig), kwok_namespace, LEASE, "slow", "http://slow", TIMING
        )
        await elector.start()
        await asyncio.wait_for(elector.leading.wait(), 20)
        slow.delay_s = 2.5  # (its connections are made meanwhile: a TLS handshake waits too)
        await asyncio.sleep(12)
        slow.delay_s = 4.5
        await asyncio.sleep(10)
        watched_until = time.monotonic() + 16
        samples, open_ = 0, 0
        while time.monotonic() < watched_until:
            samples += 1
            open_ += elector.may_write()
            await asyncio.sleep(0.1)
        assert elector.leading.is_set() and not elector.lost.is_set(), "the term ended"
        assert elector.terms == 1
        # (a renewal that needs a new connection waits for a TLS handshake too, 4.5 s more:
        # brief pauses remain; one in flight at a time would keep it shut most of the time)
        assert open_ / samples > 0.6, f"the fence was open {open_ / samples:.0%} of the time"
        print(f"fence open {open_ / samples:.0%} of the time with answers 4.5 s late")
        slow.delay_s = 0.0
        await elector.stop()
        slow.close()

    asyncio.run(scenario())
