"""A test-only stand-in for the kubelet: pods of a real control plane become local processes.

There is no container runtime on a test machine, so this process registers one Node and runs
every pod the scheduler binds to it as plain processes of the current Python environment:

- each pod gets its own loopback address (127.0.0.x, from ``--pod-cidr``), written to
  ``status.podIP`` and passed to its containers as ``KUBESERVE_POD_IP``; a container must bind
  to it, which is how two replicas of one Deployment both listen on port 8080;
- ``image`` is ignored; ``command`` + ``args`` run with ``$(VAR)`` expansion and the container's
  ``env`` (plain values, ``fieldRef``, ``configMapKeyRef``/``secretKeyRef``, ``envFrom``) on top
  of this process's environment (so ``python`` and ``kubeserve`` resolve in the test virtualenv);
- init containers run in order first; ``restartPolicy`` decides restarts (``restartCount``) and
  the terminal phase (Succeeded/Failed); a startup probe holds the other probes back until it
  succeeds; readiness probes (httpGet, tcpSocket, exec; polled at least once a second so tests
  stay quick) drive the ``Ready`` condition; liveness probes restart containers;
- a pod's service account becomes a kubeconfig (a TokenRequest token, so RBAC applies) named by
  ``KUBECONFIG`` in the containers' environment, unless ``automountServiceAccountToken`` is false;
- deletion: SIGTERM to each container's process group, SIGKILL after the grace period, then the
  pod object is removed (delete with ``gracePeriodSeconds=0``), as the kubelet does;
- the Node has a Ready condition, a Lease heartbeat, and a generous fixed capacity.

Container output goes to ``<work-dir>/pods/<namespace>_<pod>/<container>.log`` (there is no
kubelet API, so ``kubectl logs`` does not work). Only a pod's runner writes its status; every
write carries the pod's uid, so a recreated pod of the same name is never confused with the old.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ctypes
import datetime
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import yaml

from kubeserve.runtime.kubernetes.contract import BIND_HOST_ENV, POD_IP_ENV

log = logging.getLogger("fake-kubelet")

Json = dict[str, Any]
KUBELET_VERSION = "v1.36.3"
DEFAULT_CAPACITY = {
    "cpu": "64",
    "memory": "256Gi",
    "pods": "250",
    "ephemeral-storage": "500Gi",
    "nvidia.com/gpu": "8",
}
HEARTBEAT_S = 10.0
MAX_PROBE_PERIOD_S = 1.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class Api:
    """The few Kubernetes API calls the stand-in makes, over one aiohttp session."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
        user = next(u for u in config["users"] if u["name"] == context["context"]["user"])
        self.server: str = cluster["cluster"]["server"]
        self.ca_file: str = cluster["cluster"]["certificate-authority"]
        self.token: str = user["user"]["token"]
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self.token}"},
                connector=aiohttp.TCPConnector(ssl=self._ssl),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Json:
        url = f"{self.server}{path}"
        if params:
            url += "?" + urlencode(params)
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type}
        timeout = aiohttp.ClientTimeout(total=30)
        async with self.session.request(
            method, url, data=data, headers=headers, timeout=timeout
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(response.status, text)
            return dict(json.loads(text)) if text else {}

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Json]:
        """Yield watch events; ends when the server closes the stream (timeoutSeconds)."""
        query = urlencode({**params, "watch": "1", "allowWatchBookmarks": "true"})
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)
        async with self.session.get(f"{self.server}{path}?{query}", timeout=timeout) as response:
            if response.status >= 400:
                raise ApiError(response.status, await response.text())
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)


class AddressPool:
    """Loopback addresses for pods; handed out round-robin so a fresh pod never reuses a
    just-released address whose old sockets may linger."""

    def __init__(self, cidr: str) -> None:
        network = ipaddress.ip_network(cidr)
        self._free = [str(ip) for ip in network.hosts() if not str(ip).endswith(".1")]
        self._used: set[str] = set()

    def take(self) -> str:
        for index, ip in enumerate(self._free):
            if ip not in self._used:
                del self._free[index]
                self._used.add(ip)
                return ip
        raise RuntimeError("no free pod address")

    def release(self, ip: str) -> None:
        if ip in self._used:
            self._used.discard(ip)
            self._free.append(ip)


def die_with_parent() -> None:
    """Runs in the child before exec: a pod process must not outlive the stand-in."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` escapes ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR_REF.sub(replace, text)


def field_value(pod: Json, path: str) -> str:
    """The value a downward-API ``fieldRef`` names."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    label = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if label:
        return str(meta.get(label.group(1), {}).get(label.group(2), ""))
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
        "status.hostIP": status.get("hostIP", ""),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
    }
    return str(values.get(path, ""))


class Container:
    """One container of a pod: its process, restarts, probe results and reported state."""

    def __init__(self, runner: PodRunner, spec: Json, *, init: bool) -> None:
        self.runner = runner
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.process: asyncio.subprocess.Process | None = None
        self.restart_count = 0
        self.state: Json = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: Json = {}
        self.ready = False
        self.started_once = False
        self.env: dict[str, str] = {}

    def status(self) -> Json:
        status: Json = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": "running" in self.state,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.process is not None:
            status["containerID"] = f"process://{self.process.pid}"
        return status

    @property
    def log_path(self) -> Path:
        return self.runner.sandbox / f"{self.name}.log"

    async def start(self) -> bool:
        """Start the process; False (with a terminated state) when it cannot be started."""
        self.env = await self.runner.container_env(self.spec)
        command = [expand(a, self.env) for a in self.spec.get("command", [])]
        command += [expand(a, self.env) for a in self.spec.get("args", [])]
        executable = shutil.which(command[0], path=self.env.get("PATH")) if command else None
        if executable is None:
            reason = f"{command[0]!r} not found" if command else "the stand-in needs a command"
            self._terminated(127, "StartError", reason, started=now())
            return False
        cwd = self._working_dir()
        with self.log_path.open("ab") as output:
            self.process = await asyncio.create_subprocess_exec(
                executable,
                *command[1:],
                env=self.env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.started_once = True
        self.state = {"running": {"startedAt": now()}}
        self.ready = False
        log.info("%s/%s started pid %s", self.runner.key, self.name, self.process.pid)
        return True

    def _working_dir(self) -> str:
        """The image's workingDir exists only inside the image: fall back to the pod sandbox."""
        workdir = self.spec.get("workingDir")
        return workdir if workdir and Path(workdir).is_dir() else str(self.runner.sandbox)

    async def wait(self) -> int:
        assert self.process is not None
        started = self.state.get("running", {}).get("startedAt", now())
        code = await self.process.wait()
        if code < 0:  # killed by a signal: report it the way a container runtime does
            code = 128 - code
        self._terminated(code, "Completed" if code == 0 else "Error", "", started=started)
        log.info("%s/%s exited %s", self.runner.key, self.name, code)
        return code

    def _terminated(self, code: int, reason: str, message: str, *, started: str) -> None:
        state: Json = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": now(),
        }
        if message:
            state["message"] = message
        self.state = {"terminated": state}
        self.ready = False

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def probe(self, probe: Json) -> bool:
        """One probe attempt against this container, as the kubelet would make it."""
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                return await asyncio.wait_for(self._http_probe(probe["httpGet"]), timeout)
            if "tcpSocket" in probe:
                port = self._port(probe["tcpSocket"]["port"])
                host = probe["tcpSocket"].get("host") or self.runner.pod_ip
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
                writer.close()
                return True
            if "exec" in probe:
                process = await asyncio.create_subprocess_exec(
                    *probe["exec"]["command"],
                    env=self.env,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    return await asyncio.wait_for(process.wait(), timeout) == 0
                except TimeoutError:
                    process.kill()
                    await process.wait()
                    return False
        except (OSError, TimeoutError, aiohttp.ClientError):
            return False
        return True  # grpc and unknown probe kinds are not checked

    async def _http_probe(self, get: Json) -> bool:
        scheme = get.get("scheme", "HTTP").lower()
        host = get.get("host") or self.runner.pod_ip
        url = f"{scheme}://{host}:{self._port(get['port'])}{get.get('path', '/')}"
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers=headers, ssl=False, allow_redirects=False) as response,
        ):
            return 200 <= response.status < 400

    def _port(self, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for declared in self.spec.get("ports", []):
            if declared.get("name") == port:
                return int(declared["containerPort"])
        raise OSError(f"no port named {port!r}")


class PodRunner:
    """Runs one pod from first sight to removal. Owns the pod's processes and writes its status."""

    def __init__(self, kubelet: FakeKubelet, pod: Json) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.key = f"{self.namespace}/{self.name}"
        self.pod_ip = kubelet.addresses.take()
        self.sandbox = kubelet.work_dir / "pods" / f"{self.namespace}_{self.name}"
        self.sandbox.mkdir(parents=True, exist_ok=True)
        spec = pod["spec"]
        self.init_containers = [
            Container(self, c, init=True) for c in spec.get("initContainers", [])
        ]
        self.containers = [Container(self, c, init=False) for c in spec.get("containers", [])]
        if self.init_containers:
            for container in self.containers:
                container.state = {"waiting": {"reason": "PodInitializing"}}
        self.phase = "Pending"
        self.initialized = not self.init_containers
        self.start_time = now()
        self.deleting = asyncio.Event()
        self.gone = False
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._kubeconfig: Path | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._write_status_loop()))
        self._tasks.append(asyncio.create_task(self._run()))
        self.changed()

    def update(self, pod: Json) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self.deleting.is_set():
            log.info("%s deletion requested", self.key)
            self.deleting.set()

    def changed(self) -> None:
        if self.initialized:
            self._update_phase()
        self._dirty.set()

    async def _run(self) -> None:
        """Init containers, then the main containers under their supervisors until deletion is
        requested; then stop everything within the grace period and remove the pod object."""
        supervisors: list[asyncio.Task[None]] = []
        try:
            if await self._run_init_containers():
                self.initialized = True
                self.changed()
                supervisors = [asyncio.create_task(self._supervise(c)) for c in self.containers]
            await self.deleting.wait()
            await self._terminate()
            await asyncio.gather(*supervisors, return_exceptions=True)
            await self.kubelet.remove(self)
        except asyncio.CancelledError:
            await self._kill_all()
            raise

    async def _run_init_containers(self) -> bool:
        """Run init containers one after the other; True when all succeeded."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for container in self.init_containers:
            attempt = 0
            while True:
                if self.deleting.is_set():
                    return False
                if await container.start():
                    self.changed()
                    code = await self._wait_or_delete(container)
                else:
                    code = 127
                self.changed()
                if code == 0:
                    break
                if code is None or policy == "Never":
                    self.phase = "Failed" if code is not None else self.phase
                    self.changed()
                    return False
                container.restart_count += 1
                await self._backoff(container, attempt)
                attempt += 1
        return True

    async def _wait_or_delete(self, container: Container) -> int | None:
        """The container's exit code, or None when the pod is being deleted first."""
        exited = asyncio.create_task(container.wait())
        deleting = asyncio.create_task(self.deleting.wait())
        await asyncio.wait([exited, deleting], return_when=asyncio.FIRST_COMPLETED)
        deleting.cancel()
        if exited.done():
            return exited.result()
        await self._terminate()
        exited.cancel()
        return None

    async def _supervise(self, container: Container) -> None:
        """Keep a main container running as restartPolicy says; return when it stays down."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        attempt = 0
        while not self.deleting.is_set():
            if await container.start():
                self.changed()
                probes = asyncio.create_task(self._probe_loop(container))
                code = await container.wait()
                probes.cancel()
            else:
                code = 127
            self.changed()
            if self.deleting.is_set():
                return
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            container.last_state = container.state
            container.restart_count += 1
            await self._backoff(container, attempt)
            attempt = 0 if code == 0 else attempt + 1

    async def _backoff(self, container: Container, attempt: int) -> None:
        container.state = {"waiting": {"reason": "CrashLoopBackOff"}}
        self.changed()
        delay = RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.deleting.wait(), delay)

    async def _probe_loop(self, container: Container) -> None:
        readiness = container.spec.get("readinessProbe")
        liveness = container.spec.get("livenessProbe")
        startup = container.spec.get("startupProbe")
        if startup is not None and not await self._startup(container, startup):
            return
        if readiness is None:
            container.ready = True
            self.changed()
        tasks = []
        if readiness is not None:
            tasks.append(self._readiness(container, readiness))
        if liveness is not None:
            tasks.append(self._liveness(container, liveness))
        await asyncio.gather(*tasks)

    async def _readiness(self, container: Container, probe: Json) -> None:
        period = min(float(probe.get("periodSeconds", 10)), MAX_PROBE_PERIOD_S)
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        successes = failures = 0
        while container.running:
            if await container.probe(probe):
                successes, failures = successes + 1, 0
                if not container.ready and successes >= int(probe.get("successThreshold", 1)):
                    container.ready = True
                    self.changed()
            else:
                successes, failures = 0, failures + 1
                if container.ready and failures >= int(probe.get("failureThreshold", 3)):
                    container.ready = False
                    self.changed()
            await asyncio.sleep(period)

    async def _startup(self, container: Container, probe: Json) -> bool:
        """Until the startup probe succeeds once (then the other probes start), as the kubelet
        does; after ``failureThreshold`` failures the container is stopped (and restarted)."""
        period = min(float(probe.get("periodSeconds", 10)), MAX_PROBE_PERIOD_S)
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        failures = 0
        while container.running:
            if await container.probe(probe):
                return True
            failures += 1
            if failures >= int(probe.get("failureThreshold", 3)):
                log.info("%s/%s failed its startup probe", self.key, container.name)
                await self._stop(container, self._grace_period())
                return False
            await asyncio.sleep(period)
        return False

    async def _liveness(self, container: Container, probe: Json) -> None:
        period = float(probe.get("periodSeconds", 10))
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        failures = 0
        while container.running:
            failures = 0 if await container.probe(probe) else failures + 1
            if failures >= int(probe.get("failureThreshold", 3)):
                log.info("%s/%s failed its liveness probe", self.key, container.name)
                await self._stop(container, self._grace_period())
                return
            await asyncio.sleep(period)

    def _update_phase(self) -> None:
        if self.phase in ("Succeeded", "Failed"):
            return
        policy = self.pod["spec"].get("restartPolicy", "Always")
        states = [c.state for c in self.containers]
        if any("running" in s for s in states):
            self.phase = "Running"
            return
        codes = [s["terminated"]["exitCode"] for s in states if "terminated" in s]
        if len(codes) < len(states) or policy == "Always":
            return
        if all(code == 0 for code in codes):
            self.phase = "Succeeded"
        elif policy == "Never":
            self.phase = "Failed"

    def _grace_period(self) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        grace = meta.get(
            "deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)
        )
        return float(grace)

    async def _stop(self, container: Container, grace: float) -> None:
        if not container.running:
            return
        container.signal(signal.SIGTERM)
        assert container.process is not None
        try:
            await asyncio.wait_for(asyncio.shield(container.process.wait()), grace)
        except TimeoutError:
            log.info("%s/%s ignored SIGTERM for %ss; killing", self.key, container.name, grace)
            container.signal(signal.SIGKILL)
            await container.process.wait()

    async def _terminate(self) -> None:
        """Stop every container within the pod's grace period (SIGTERM, then SIGKILL)."""
        grace = self._grace_period()
        await asyncio.gather(
            *(self._stop(c, grace) for c in self.init_containers + self.containers)
        )
        for container in self.init_containers + self.containers:
            if container.process is not None:
                await container.process.wait()

    async def _kill_all(self) -> None:
        for container in self.init_containers + self.containers:
            container.signal(signal.SIGKILL)
        for container in self.init_containers + self.containers:
            if container.process is not None:
                with contextlib.suppress(Exception):
                    await container.process.wait()

    async def stop(self) -> None:
        """Forget the pod (it is gone from the API): kill its processes, end its tasks."""
        self.gone = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._kill_all()

    # -- environment ------------------------------------------------------------------------------
    async def container_env(self, spec: Json) -> dict[str, str]:
        env = dict(self.kubelet.base_env)
        env.update({"HOSTNAME": self.name, POD_IP_ENV: self.pod_ip})
        kubeconfig = await self._service_account_kubeconfig()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        for source in spec.get("envFrom", []):
            values = await self._env_source(source)
            env.update({source.get("prefix", "") + k: v for k, v in values.items()})
        for var in spec.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif "valueFrom" in var:
                value = await self._env_value(var["valueFrom"], spec)
                if value is not None:
                    env[var["name"]] = value
        # Pods here share the machine's network: pin kubeserve's bind address to the pod's own
        # loopback address, as a network namespace would isolate a real pod's 0.0.0.0.
        env[BIND_HOST_ENV] = self.pod_ip
        return env

    async def _env_value(self, source: Json, spec: Json) -> str | None:
        pod = {**self.pod, "status": self.status()}
        if "fieldRef" in source:
            return field_value(pod, source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            kind, _, resource = ref["resource"].partition(".")
            return str(spec.get("resources", {}).get(kind, {}).get(resource, "0"))
        for key, kind in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            if key in source:
                values = await self._read_data(kind, source[key]["name"])
                return values.get(source[key]["key"])
        return None

    async def _env_source(self, source: Json) -> dict[str, str]:
        if "configMapRef" in source:
            return await self._read_data("configmaps", source["configMapRef"]["name"])
        if "secretRef" in source:
            return await self._read_data("secrets", source["secretRef"]["name"])
        return {}

    async def _read_data(self, kind: str, name: str) -> dict[str, str]:
        path = f"/api/v1/namespaces/{self.namespace}/{kind}/{name}"
        try:
            obj = await self.kubelet.api.call("GET", path)
        except ApiError:
            return {}
        if kind == "secrets":
            return {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
        return dict(obj.get("data", {}))

    async def _service_account_kubeconfig(self) -> Path | None:
        """A kubeconfig with a token of the pod's service account (RBAC applies to its calls)."""
        spec = self.pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        if self._kubeconfig is not None:
            return self._kubeconfig
        account = spec.get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 86400,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.name,
                    "uid": self.uid,
                },
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token"
        try:
            token = (await self.kubelet.api.call("POST", path, request))["status"]["token"]
        except ApiError as err:
            log.warning("%s: no service account token: %s", self.key, err)
            return None
        self._kubeconfig = self.sandbox / "kubeconfig"
        self._kubeconfig.write_text(
            kubeconfig_text(
                self.kubelet.api.server, self.kubelet.api.ca_file, token, self.namespace
            )
        )
        return self._kubeconfig

    # -- status -----------------------------------------------------------------------------------
    def status(self) -> Json:
        ready = self.phase == "Running" and all(c.ready for c in self.containers)
        stamp = now()

        def condition(kind: str, value: bool) -> Json:
            return {"type": kind, "status": str(value), "lastTransitionTime": stamp}

        return {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": [
                condition("PodScheduled", True),
                condition("Initialized", self.initialized),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "initContainerStatuses": [c.status() for c in self.init_containers],
            "containerStatuses": [c.status() for c in self.containers],
        }

    async def _write_status_loop(self) -> None:
        last: Json | None = None
        while not self.gone:
            await self._dirty.wait()
            self._dirty.clear()
            status = self.status()
            if _without_times(status) == _without_times(last):
                continue
            if last is not None:  # keep transition times of conditions that did not change
                before = {c["type"]: c for c in last["conditions"]}
                for cond in status["conditions"]:
                    if before.get(cond["type"], {}).get("status") == cond["status"]:
                        cond["lastTransitionTime"] = before[cond["type"]]["lastTransitionTime"]
            try:
                await self.kubelet.api.call(
                    "PATCH",
                    f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                    {"metadata": {"uid": self.uid}, "status": status},
                    content_type="application/merge-patch+json",
                )
                last = status
            except ApiError as err:
                if err.status == 404:
                    return
                log.warning("%s: status update failed: %s", self.key, err)
                self._dirty.set()
                await asyncio.sleep(0.5)
            except (aiohttp.ClientError, TimeoutError) as err:
                log.warning("%s: status update failed: %s", self.key, err)
                self._dirty.set()
                await asyncio.sleep(0.5)


def _without_times(status: Json | None) -> Any:
    if status is None:
        return None
    return [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status["conditions"]
    ], {k: v for k, v in status.items() if k != "conditions"}


def kubeconfig_text(server: str, ca_file: str, token: str, namespace: str = "default") -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubeserve-test",
                "cluster": {"server": server, "certificate-authority": ca_file},
            }
        ],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [
            {
                "name": "kubeserve-test",
                "context": {"cluster": "kubeserve-test", "user": "user", "namespace": namespace},
            }
        ],
        "current-context": "kubeserve-test",
    }
    return yaml.safe_dump(config)


class FakeKubelet:
    """Registers the node, keeps it alive, and keeps one PodRunner per pod bound to it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.api = Api(Path(args.kubeconfig))
        self.node_name: str = args.node_name
        self.work_dir = Path(args.work_dir)
        self.addresses = AddressPool(args.pod_cidr)
        self.labels = dict(kv.split("=", 1) for kv in args.label)
        self.capacity = {**DEFAULT_CAPACITY, **dict(kv.split("=", 1) for kv in args.capacity)}
        self.runners: dict[str, PodRunner] = {}
        self.base_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        self.registered_at = now()

    async def run(self) -> None:
        await self.register_node()
        heartbeat = asyncio.create_task(self.heartbeat_loop())
        try:
            await self.watch_pods()
        finally:
            heartbeat.cancel()
            await asyncio.gather(*(r.stop() for r in self.runners.values()))
            await self.api.close()

    # -- node -------------------------------------------------------------------------------------
    def node_status(self) -> Json:
        stamp = now()
        since = self.registered_at
        conditions = [
            ("Ready", "True", "KubeletReady", "the kubeserve kubelet stand-in is ready"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
            ("PIDPressure", "False", "KubeletHasSufficientPID", ""),
        ]
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [
                {
                    "type": kind,
                    "status": value,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": since,
                }
                for kind, value, reason, message in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "process://kubeserve-fake-kubelet",
                "kernelVersion": os.uname().release,
                "osImage": "kubeserve test node",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    async def register_node(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.labels,
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": labels},
        }
        try:
            await self.api.call("POST", "/api/v1/nodes", node)
        except ApiError as err:
            if err.status != 409:
                raise
            await self.api.call(
                "PATCH",
                f"/api/v1/nodes/{self.node_name}",
                {"metadata": {"labels": labels}},
                content_type="application/merge-patch+json",
            )
        await self.patch_node_status()
        log.info("node %s registered", self.node_name)

    async def patch_node_status(self) -> None:
        await self.api.call(
            "PATCH",
            f"/api/v1/nodes/{self.node_name}/status",
            {"status": self.node_status()},
            content_type="application/merge-patch+json",
        )

    async def heartbeat_loop(self) -> None:
        """Renew the node Lease and the Ready condition so the node lifecycle controller never
        marks the node unreachable (which would evict every pod)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node_name}"
        while True:
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
                "spec": {
                    "holderIdentity": self.node_name,
                    "leaseDurationSeconds": 40,
                    "renewTime": stamp,
                },
            }
            try:
                try:
                    await self.api.call(
                        "PATCH", path, lease, content_type="application/merge-patch+json"
                    )
                except ApiError as err:
                    if err.status != 404:
                        raise
                    await self.api.call("POST", path.rsplit("/", 1)[0], lease)
                await self.patch_node_status()
            except (ApiError, aiohttp.ClientError, TimeoutError) as err:
                log.warning("heartbeat failed: %s", err)
            await asyncio.sleep(HEARTBEAT_S)

    # -- pods -------------------------------------------------------------------------------------
    async def watch_pods(self) -> None:
        """List then watch this node's pods, resuming from the last resourceVersion (bookmarks keep
        it fresh); a 410 Gone or a broken stream falls back to a fresh list."""
        selector = {"fieldSelector": f"spec.nodeName={self.node_name}"}
        version: str | None = None
        while True:
            try:
                if version is None:
                    listed = await self.api.call("GET", "/api/v1/pods", params=selector)
                    version = listed["metadata"]["resourceVersion"]
                    await self.sync(listed["items"])
                params = {**selector, "resourceVersion": version, "timeoutSeconds": "240"}
                async for event in self.api.watch("/api/v1/pods", params):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        log.info("watch error %s; relisting", obj.get("message"))
                        version = None
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        await self.observe(obj)
                    elif event["type"] == "DELETED":
                        await self.forget(obj["metadata"]["uid"])
            except (ApiError, aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as err:
                log.warning("pod watch failed (%s); relisting", err)
                version = None
                await asyncio.sleep(0.5)

    async def sync(self, pods: list[Json]) -> None:
        uids = {pod["metadata"]["uid"] for pod in pods}
        for uid in [uid for uid in self.runners if uid not in uids]:
            await self.forget(uid)
        for pod in pods:
            await self.observe(pod)

    async def observe(self, pod: Json) -> None:
        uid = pod["metadata"]["uid"]
        runner = self.runners.get(uid)
        if runner is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                if pod["metadata"].get("deletionTimestamp"):
                    await self.delete_pod(
                        pod["metadata"]["namespace"], pod["metadata"]["name"], uid
                    )
                return  # finished before this stand-in started: nothing to run
            runner = self.runners[uid] = PodRunner(self, pod)
            log.info("%s assigned %s", runner.key, runner.pod_ip)
            runner.update(pod)
            runner.start()
        else:
            runner.update(pod)

    async def forget(self, uid: str) -> None:
        runner = self.runners.pop(uid, None)
        if runner is not None:
            await runner.stop()
            self.addresses.release(runner.pod_ip)
            log.info("%s removed", runner.key)

    async def remove(self, runner: PodRunner) -> None:
        """The pod's processes are gone after a deletion request: remove the object itself."""
        await self.delete_pod(runner.namespace, runner.name, runner.uid)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        for _ in range(20):
            try:
                await self.api.call("DELETE", path, body)
                return
            except ApiError as err:
                if err.status in (404, 409):
                    return
                log.warning("%s/%s: delete failed: %s", namespace, name, err)
            except (aiohttp.ClientError, TimeoutError) as err:
                log.warning("%s/%s: delete failed: %s", namespace, name, err)
            await asyncio.sleep(0.5)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True, help="admin kubeconfig (token auth)")
    parser.add_argument("--node-name", default="kubeserve-test-node")
    parser.add_argument("--work-dir", required=True, help="pod sandboxes and container logs")
    parser.add_argument("--pod-cidr", default="127.0.0.0/16", help="loopback range for pod IPs")
    parser.add_argument("--label", action="append", default=[], help="extra node label k=v")
    parser.add_argument("--capacity", action="append", default=[], help="capacity override k=v")
    return parser.parse_args(argv)


async def main_async(args: argparse.Namespace) -> None:
    kubelet = FakeKubelet(args)
    task = asyncio.create_task(kubelet.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main_async(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
