"""What the processes of kubeserve's pods do for the operator, for the pods kwok runs.

kwok runs no container: a build Job's pod just succeeds and a replica pod is Ready with an address
nobody listens on. The operator, though, waits for two things that only those processes do:

* a **build** writes the application's graph to the ConfigMap its command names. Here the graph
  of each import path is built once, by the real ``kubeserve build`` run on this machine with
  ``tests/apps`` on its path, and written (:func:`~kubeserve.runtime.kubernetes.graph.
  graph_configmap`, the body the build writes) for every build Job that appears;
* a **replica** answers the operator's health check and ``reconfigure`` on its CONTROL channel,
  reporting the ``user_config`` version it applied (the operator counts a replica as up to date
  only then). Here each replica pod gets the replica's own HTTP server
  (:class:`~kubeserve.runtime.replica.http.ReplicaHttpServer`, with the instance's secret and the
  pod's name as its identity) listening on the pod's address, answering those two endpoints as a
  replica does (a freshly started replica has applied no ``user_config``; a reconfigure applies
  the one sent). User traffic is answered 503: nothing serves it.

Everything runs in one thread with its own event loop, started and stopped by the context manager;
the pods' addresses are local ones (:mod:`support.kwok_cluster`).

A stand-in that fails (the API server of a loaded machine times out a read, the instance's secret
is not there yet) is tried again every :data:`RETRY_S` with the object's latest version: kwok sends
no further event for a pod once it is Ready, so one failure would otherwise leave its replica
missing, and its application never Ready. An address kwok gives to a new pod is taken from any
pod that held it before (whose deletion a re-list may have missed).

Jobs and pods are listed cluster-wide in pages of :data:`PAGE_SIZE` (a thousand applications are
6,000 pods) and watched from there; a watch that ends resumes at the last version it saw (events
and bookmarks), and only a version too old to resume from (410 Gone) or watches failing again and
again make the stand-ins list again (:attr:`PodStandIns.lists` counts them).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from kubeserve.control.user_config import user_config_version
from kubeserve.runtime import wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Kube, KubeConflict, KubeError
from kubeserve.runtime.kubernetes.graph import graph_configmap
from kubeserve.runtime.replica.http import HttpRequest, HttpResponse, ReplicaHttpServer
from support.common import ROOT

APPS = ROOT / "tests" / "apps"
#: how often the stand-ins of objects whose handling failed are tried again
RETRY_S = 1.0
#: graph ConfigMaps written at once
CONCURRENT_WRITES = 32
#: objects per page of the stand-ins' lists: 5,000 replica pods in one answer outlasted the API
#: server's request timeout (60 s) on a loaded machine
PAGE_SIZE = 500
#: watches failing in a row (not for a version too old) before the stand-ins list again
WATCH_FAILURES = 3
#: the status of a watch or a continue token whose version etcd compacted
GONE = 410


class PodStandIns:
    """The build and replica processes of every kubeserve pod of the cluster (see the module)."""

    def __init__(
        self, kubeconfig: Path, app_dirs: tuple[Path, ...] = (APPS,), watch_timeout_s: int = 300
    ) -> None:
        self.kubeconfig, self.app_dirs = kubeconfig, app_dirs
        #: how long the API server lets each watch run before ending it
        self.watch_timeout_s = watch_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._main: asyncio.Task[None] | None = None
        #: (import path, args) -> the graph document, or the error of building it
        self._graphs: dict[tuple[str, str], str] = {}
        #: namespace/pod -> (pod uid and IP, its server)
        self._replicas: dict[str, tuple[str, asyncio.Server]] = {}
        #: pod IP -> the namespace/pod listening on it
        self._by_ip: dict[str, str] = {}
        #: build Jobs seen (uid), their graph-writing tasks, and the bound on those
        self._builds: set[str] = set()
        self._build_tasks: set[asyncio.Task[None]] = set()
        self._writes = asyncio.Semaphore(CONCURRENT_WRITES)
        self._graph_locks: dict[tuple[str, str], asyncio.Lock] = {}
        #: kind and namespace/name -> (handler, event, latest object) whose handling failed
        self._failed: dict[tuple[str, str], tuple[Any, str, dict[str, Any]]] = {}
        #: namespace/pod -> the user_config version the replica reports
        self.applied: dict[str, str] = {}
        #: namespace/instance -> the data-plane secret
        self._secrets: dict[str, bytes] = {}
        self.graphs_written = 0
        self.errors: list[str] = []
        #: kind -> lists made (the first, then one per watch that could not resume)
        self.lists: dict[str, int] = {}

    def __enter__(self) -> PodStandIns:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    async def _start(self) -> None:
        self._main = asyncio.get_running_loop().create_task(self._run())

    async def _stop(self) -> None:
        assert self._main is not None
        self._main.cancel()
        for task in self._build_tasks:
            task.cancel()
        await asyncio.gather(self._main, *self._build_tasks, return_exceptions=True)
        for key in list(self._replicas):
            await self._close(key)

    @property
    def replicas(self) -> int:
        """Replica pods answering now."""
        return len(self._replicas)

    # -- the loop ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        kube = await Kube.connect(str(self.kubeconfig))
        try:
            await asyncio.gather(
                self._follow(kube, "Job", contract.COMPONENT_BUILD, self._on_job),
                self._follow(kube, "Pod", contract.COMPONENT_REPLICA, self._on_pod),
                self._retry(kube),
            )
        finally:
            await kube.close()

    async def _follow(self, kube: Kube, kind: str, component: str, handle: Any) -> None:
        """List ``kind`` of ``component`` in every namespace, in pages, then watch from the
        list's version; again from a fresh list only when the watch cannot resume (see
        :meth:`_watch`)."""
        selector = f"{contract.COMPONENT_LABEL}={component}"
        while True:
            try:
                items, version = await kube.list_with_version(
                    kind, None, selector, page_size=PAGE_SIZE
                )
                self.lists[kind] = self.lists.get(kind, 0) + 1
                if kind == "Pod":  # pods deleted while no watch ran: no event says so
                    listed = {_key(item) for item in items}
                    for key in [k for k in self._replicas if k not in listed]:
                        await self._close(key)
                for item in items:
                    await self._handle(handle, kube, kind, "ADDED", item)
                del items
                await self._watch(kube, kind, selector, handle, version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the list failed: list again
                self.errors.append(f"{kind} list: {exc!r}")
                await asyncio.sleep(0.5)

    async def _watch(self, kube: Kube, kind: str, selector: str, handle: Any, version: str) -> None:
        """Watch from ``version``, one event at a time, each watch resuming at the version of
        the last event or bookmark of the one before (the server ends a watch every few
        minutes; a connection may break): a re-list of thousands of pods on a loaded API server
        is what the stand-ins must not do at every turn. Returns when ``version`` is too old
        to resume from (410 Gone: etcd compacted it) or after :data:`WATCH_FAILURES` failed
        watches in a row: the caller lists again."""
        failures = 0
        while failures < WATCH_FAILURES:
            try:
                watch = kube.watch(kind, None, selector, version, self.watch_timeout_s)
                async for event in watch:
                    version = event.object["metadata"].get("resourceVersion", version)
                    failures = 0
                    if event.type != "BOOKMARK":
                        await self._handle(handle, kube, kind, event.type, event.object)
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if exc.status == GONE:
                    return
                failures += 1
                self.errors.append(f"{kind} watch: {exc!r}")
                await asyncio.sleep(0.5)
            except Exception as exc:  # the connection broke: resume from the same version
                failures += 1
                self.errors.append(f"{kind} watch: {exc!r}")
                await asyncio.sleep(0.5)

    async def _handle(
        self, handle: Any, kube: Kube, kind: str, event: str, obj: dict[str, Any]
    ) -> None:
        failed = (kind, _key(obj))
        self._failed.pop(failed, None)  # this version supersedes the one that failed
        try:
            await handle(kube, event, obj)
        except Exception as exc:  # one object's trouble must not stop the others
            self.errors.append(f"{obj['metadata'].get('name')}: {exc!r}")
            self._failed[failed] = (handle, event, obj)

    async def _retry(self, kube: Kube) -> None:
        """Handle again, every :data:`RETRY_S`, the objects whose last handling failed."""
        while True:
            await asyncio.sleep(RETRY_S)
            for (kind, _), (handle, event, obj) in list(self._failed.items()):
                await self._handle(handle, kube, kind, event, obj)

    # -- builds -----------------------------------------------------------------------------------
    async def _on_job(self, kube: Kube, event: str, job: dict[str, Any]) -> None:
        """A build Job: its graph written in a task of its own (a thousand Jobs at once, each
        write a second on a busy API server, one at a time would make the builds the slowest
        part of every figure); each Job once (by uid: a build deleted and created again under
        its name is a new one), its later events (status) ignored."""
        uid = str(job["metadata"].get("uid"))
        if event == "DELETED" or uid in self._builds:
            return
        self._builds.add(uid)
        task = asyncio.ensure_future(self._build(kube, event, job))
        self._build_tasks.add(task)
        task.add_done_callback(self._build_tasks.discard)

    async def _build(self, kube: Kube, event: str, job: dict[str, Any]) -> None:
        async with self._writes:
            await self._handle(self._write_graph, kube, "Job", event, job)

    async def _write_graph(self, kube: Kube, _event: str, job: dict[str, Any]) -> None:
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        options = dict(zip(command[3::2], command[4::2], strict=False))
        if command[2].startswith("--") or "--configmap" not in options:
            raise ValueError(f"a build this stand-in cannot run: {command}")
        namespace = job["metadata"]["namespace"]
        name = options["--configmap"]
        import_path = command[2].replace("$$", "$")
        args = options.get("--args", "{}").replace("$$", "$")
        document = await self._graph(import_path, args)
        body = graph_configmap(  # a shared build names no application: the operator owns it
            namespace,
            name,
            document,
            options.get("--application", ""),
            options.get("--application-uid", ""),
        )
        with contextlib.suppress(KubeConflict):  # written already
            await kube.create("ConfigMap", namespace, body)
            self.graphs_written += 1

    async def _graph(self, import_path: str, args: str) -> str:
        key = (import_path, args)
        async with self._graph_locks.setdefault(key, asyncio.Lock()):
            return await self._built(key, import_path, args)

    async def _built(self, key: tuple[str, str], import_path: str, args: str) -> str:
        if key not in self._graphs:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(str(d) for d in self.app_dirs)
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kubeserve.cli", "build", import_path, "--args", args,
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            out, err = await process.communicate()
            document = out.decode().strip() or json.dumps({"error": err.decode()[-2000:]})
            self._graphs[key] = document
        return self._graphs[key]

    # -- replicas ---------------------------------------------------------------------------------
    async def _on_pod(self, kube: Kube, event: str, pod: dict[str, Any]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        running = self._replicas.get(key)
        ip = status.get("podIP")
        gone = event == "DELETED" or meta.get("deletionTimestamp") or not ip
        # kwok may give a pod another address (it retries a status update that conflicted)
        if running is not None and (gone or running[0] != f"{meta['uid']}/{ip}"):
            await self._close(key)
            running = None
        if gone or running is not None:
            return
        instance = meta["labels"][contract.INSTANCE_LABEL]
        secret = await self._secret(kube, meta["namespace"], instance)
        if key in self._replicas:  # the retry and the watch raced for it
            return
        previous = self._by_ip.get(ip)
        if previous is not None and previous != key:  # kwok gave the address to this pod now
            await self._close(previous)
        server = ReplicaHttpServer(
            _unserved,
            control=lambda request: self._control(key, request),
            secret=secret,
            identity=meta["name"],
        )
        listener = await asyncio.get_running_loop().create_server(
            server, ip, contract.REPLICA_PORT, reuse_address=True
        )
        self._replicas[key] = (f"{meta['uid']}/{ip}", listener)
        self._by_ip[ip] = key
        self.applied[key] = user_config_version(None)

    async def _control(self, key: str, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path == wire.RECONFIGURE_PATH:
            self.applied[key] = user_config_version(json.loads(request.body)["user_config"])
        elif request.path != wire.HEALTHZ_PATH:
            return HttpResponse(404, b"not a replica endpoint of this stand-in")
        body = wire.health_answer(self.applied[key])
        return HttpResponse(200, body, content_type="application/json")

    async def _secret(self, kube: Kube, namespace: str, instance: str) -> bytes:
        key = f"{namespace}/{instance}"
        if key not in self._secrets:
            obj = await kube.get("Secret", namespace, contract.dataplane_secret_name(instance))
            if obj is None:
                raise LookupError(f"no data-plane secret for {key} yet")
            raw = obj["data"][contract.DATA_PLANE_SECRET_KEY]
            self._secrets[key] = base64.b64decode(raw).strip()
        return self._secrets[key]

    async def _close(self, key: str) -> None:
        _, listener = self._replicas.pop(key)
        self.applied.pop(key, None)
        for ip in [ip for ip, holder in self._by_ip.items() if holder == key]:
            del self._by_ip[ip]
        listener.close()


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


async def _unserved(_: HttpRequest) -> HttpResponse:
    return HttpResponse(503, b"a kwok pod: no user code runs here")
