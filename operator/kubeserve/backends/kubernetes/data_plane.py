"""The data plane as the operator talks to it: each instance's secret, and user_config pushes.

Owns two pieces of in-process memory: the data-plane secret of each ``ServeInstance`` (read or
created once, cached by the instance's uid; never logged, never in a status) and the
``user_config`` version each replica process (:func:`~.pods.replica_key`) last *reported* having
applied (:mod:`kubeserve.control.user_config`: the replica owns that fact). A replica the
operator has not heard from yet (a new pod, or any pod after an operator restart) is first asked
(its health answer); only one that reports another version than the desired one is sent a
reconfigure. Both run in the background; when one ends, ``on_pushed`` (the operator's wake-up,
given at construction) schedules a pass over the pod's application that reports the new state
(a second later when the push failed: the replica may not listen yet).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubeserve.backends.kubernetes import render
from kubeserve.backends.kubernetes.pods import pod_ready, replica_key
from kubeserve.backends.kubernetes.render_pod import node_sockets_probe
from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.control.user_config import needs_push
from kubeserve.runtime import channel, wire
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.client import Kube, KubeConflict, KubeError
from kubeserve.runtime.metrics_listener import metrics_token
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath
from kubeserve.schema.resources import NodeSocketsStatus

log = logging.getLogger(__name__)

_RECONFIGURE_TIMEOUT_S = 30.0
#: how long after a failed push its application's pass runs again
_RETRY_S = 1.0
#: how long the status of an application waits for the first answer of a ready replica this
#: process has not heard from (see :meth:`DataPlane.awaiting_first_answer`)
FIRST_ANSWER_S = 10.0
#: :meth:`DataPlane.node_sockets` of a namespace that admits the pods of node-local sockets
_ADMITTED = NodeSocketsStatus(
    enabled=True,
    reason="Auto: the namespace admits pods with the node's socket directory (a server-side "
    "dry run of one)",
)
#: the API server's refusal of a pod whose service account does not exist (yet): no answer
_SERVICE_ACCOUNT_LOOKUP = "error looking up service account"


@dataclass
class DataPlane:
    kube: Kube
    #: called with the pod when a user_config push to it ended (schedules a pass over its
    #: application); :data:`_RETRY_S` after it ended when it failed
    on_pushed: Callable[[dict[str, Any]], None]
    #: where pods reach the operator's admin server with their load reports (``None``: nowhere,
    #: so deployments cannot scale to zero); rendered into the proxy and replica pods
    report_url: str | None = None
    #: the data path of the proxies of an instance that does not choose one (``--proxy-data-path``)
    default_data_path: DataPath = DEFAULT_DATA_PATH
    #: whether an instance whose ``spec.proxy.nodeLocalSockets`` is unset uses node-local sockets
    #: where its namespace admits them (``--node-local-sockets auto``), or never (``off``)
    node_sockets_auto: bool = True
    #: replica process (:func:`replica_key`) -> the user_config version it last reported
    user_configs: dict[str, str] = field(default_factory=dict)
    _pushing: set[str] = field(default_factory=set)
    #: replica process -> when this process first asked it what it applied (monotonic)
    _asked: dict[str, float] = field(default_factory=dict)
    #: ServeInstance uid -> its data-plane secret (never logged, never in a status)
    _secrets: dict[str, bytes] = field(default_factory=dict, repr=False)
    #: ServeInstance uid -> whether its namespace admitted the pods of node-local sockets
    _node_sockets: dict[str, NodeSocketsStatus] = field(default_factory=dict)

    def known_secret(self, instance_uid: str) -> bytes | None:
        """The secret of the instance with ``instance_uid`` once a pass has read it, else None."""
        return self._secrets.get(instance_uid)

    async def secret(self, instance: dict[str, Any]) -> bytes:
        """The data-plane secret of ``instance`` (a ServeInstance object), read once and cached.

        Creates the Secret :func:`~kubeserve.runtime.kubernetes.contract.dataplane_secret_name`
        with 32 random bytes (hex) when it is missing, owned by the instance. One left by a deleted
        instance of the same name (another uid) raises :class:`KubeError` (the pass is retried)
        until the garbage collector removed it, so the operator needs only ``get`` and ``create``
        on Secrets. Keyed by the instance's uid: a recreated instance gets a fresh secret.
        """
        meta = instance["metadata"]
        cached = self._secrets.get(meta["uid"])
        if cached is not None:
            return cached
        namespace, name = meta["namespace"], contract.dataplane_secret_name(meta["name"])
        obj = await self.kube.get("Secret", namespace, name)
        if obj is not None and not _owned_by(obj, meta["uid"]):
            raise KubeError(  # retried: the garbage collector removes it shortly
                409, "Conflict", f"Secret {namespace}/{name} of a deleted instance is still there"
            )
        if obj is None:
            wanted = render.render_data_plane_secret(
                render.instance_view(instance), channel.new_secret()
            )
            try:
                obj = await self.kube.create("Secret", namespace, wanted)
            except KubeConflict:  # created meanwhile: read it
                obj = await self.kube.get("Secret", namespace, name)
        secret = _secret_value(obj)
        if secret is None:
            raise KubeError(500, "InvalidSecret", f"Secret {namespace}/{name} holds no valid key")
        await self._publish_metrics_token(instance, secret)
        self._secrets[meta["uid"]] = secret
        return secret

    def instance_view(self, instance: dict[str, Any]) -> render.InstanceView:
        """The render view of ``instance`` with this operator's defaults and, when its
        ``spec.proxy.nodeLocalSockets`` is unset, the choice :meth:`node_sockets` made (an
        instance not asked yet is rendered with TCP)."""
        decided = self._node_sockets.get(instance["metadata"]["uid"])
        return render.instance_view(
            instance,
            self.report_url,
            self.default_data_path,
            sockets_admitted=bool(decided and decided.enabled),
        )

    async def node_sockets(self, instance: dict[str, Any]) -> NodeSocketsStatus:
        """Whether ``instance``'s pods use node-local sockets, and why.

        ``spec.proxy.nodeLocalSockets`` decides when set. Unset, with ``node_sockets_auto``: the
        API server is asked once per instance (by uid, for this process's life) with a
        server-side dry run of :func:`~.render_pod.node_sockets_probe` in the instance's
        namespace; admitted, the sockets are used; refused (Pod Security below ``privileged``, a
        policy webhook, no RBAC to create pods), TCP, and the refusal is the reason. An answer
        that says nothing about admission (the API server failing, the data-plane service
        account not there yet) raises :class:`KubeError`, and the pass is retried. A new leader
        asks again: a namespace whose admission changed meanwhile gets the other choice, which
        rolls the pods once."""
        meta = instance["metadata"]
        view = render.instance_view(instance)
        chosen = view.spec.proxy.node_local_sockets if view.spec.proxy else None
        if chosen is not None:
            return NodeSocketsStatus(
                enabled=chosen, reason=f"spec.proxy.nodeLocalSockets is {str(chosen).lower()}"
            )
        if not self.node_sockets_auto:
            return NodeSocketsStatus(
                enabled=False, reason="the operator's --node-local-sockets is off"
            )
        cached = self._node_sockets.get(meta["uid"])
        if cached is not None:
            return cached
        probe = node_sockets_probe(
            view.namespace,
            view.name,
            view.image,
            view.image_pull_policy,
            contract.dataplane_account_name(view.name),
        )
        try:
            await self.kube.create("Pod", view.namespace, probe, dry_run=True)
        except KubeConflict:  # a pod of the probe's name exists: admission came before that
            decided = _ADMITTED
        except KubeError as err:
            if _SERVICE_ACCOUNT_LOOKUP in err.message:  # the instance's pass creates it
                raise KubeError(
                    err.status,
                    "NotYet",
                    f"node-local sockets: service account {probe['spec']['serviceAccountName']} "
                    "not there yet (the ServeInstance's pass creates it)",
                ) from None
            if err.status >= 500 or err.status == 429:
                raise
            reason = f"Auto: TCP, as the namespace refuses such pods: {err.message}"
            decided = NodeSocketsStatus(enabled=False, reason=reason)
        else:
            decided = _ADMITTED
        self._node_sockets[meta["uid"]] = decided
        log.info(
            "ServeInstance %s/%s: node-local sockets %s (%s)",
            view.namespace, view.name, "on" if decided.enabled else "off", decided.reason,
        )  # fmt: skip
        return decided

    async def _publish_metrics_token(self, instance: dict[str, Any], secret: bytes) -> None:
        """Create the Secret holding the bearer token of the instance's metrics ports (what
        Prometheus presents) when it is missing."""
        namespace = instance["metadata"]["namespace"]
        name = contract.metrics_token_secret_name(instance["metadata"]["name"])
        if await self.kube.get("Secret", namespace, name) is not None:
            return
        wanted = render.render_metrics_token_secret(
            render.instance_view(instance), metrics_token(secret)
        )
        with contextlib.suppress(KubeConflict):  # created meanwhile
            await self.kube.create("Secret", namespace, wanted)

    def awaiting_first_answer(self, pods: list[dict[str, Any]]) -> bool:
        """Whether a ready pod among ``pods`` has not told this process what it applied yet,
        asked less than :data:`FIRST_ANSWER_S` ago: after an operator restart (a Helm upgrade, a
        new leader) every replica is such a one for a moment, and a status derived then would
        say DEPLOYING of an application that never stopped RUNNING. Its answer wakes a pass."""
        now = time.monotonic()
        for pod in pods:
            uid = replica_key(pod)
            if uid in self.user_configs or not pod_ready(pod):
                continue
            asked = self._asked.get(uid)
            if asked is not None and now - asked < FIRST_ANSWER_S:
                return True
        return False

    def forget_pod(self, pod: dict[str, Any]) -> None:
        """Drop what is known of the processes of a deleted pod."""
        prefix = f"{pod['metadata']['uid']}/"
        for known in (self.user_configs, self._asked):
            for uid in [uid for uid in known if uid.startswith(prefix)]:
                del known[uid]

    def forget_secret(self, instance_uid: str) -> None:
        """Read the Secret again next time (a replica refused the cached one)."""
        self._secrets.pop(instance_uid, None)

    async def push_user_config(
        self,
        pods: list[dict[str, Any]],
        config: EffectiveDeployment,
        secret: bytes,
        instance_uid: str,
    ) -> None:
        """Bring every ready replica to the deployment's user_config: ask one not heard from
        what it applied, send the value to one that reports another version."""
        version = config.user_config_version
        for pod in pods:
            uid = replica_key(pod)
            ip = (pod.get("status") or {}).get("podIP")
            if (
                not ip
                or not pod_ready(pod)
                or not needs_push(self.user_configs.get(uid), version)
                or uid in self._pushing
            ):
                continue
            self._pushing.add(uid)
            if uid not in self.user_configs:
                self._asked.setdefault(uid, time.monotonic())
            body = json.dumps({"user_config": config.user_config}).encode()
            name = str(pod["metadata"]["name"])
            push = self._converge(pod, uid, ip, name, body, version, secret, instance_uid)
            task = asyncio.ensure_future(push)
            task.add_done_callback(functools.partial(self._pushed, uid))

    def _pushed(self, uid: str, _task: object) -> None:
        self._pushing.discard(uid)

    async def _converge(
        self,
        pod: dict[str, Any],
        uid: str,
        ip: str,
        pod_name: str,
        body: bytes,
        version: str,
        secret: bytes,
        instance_uid: str,
    ) -> None:
        """Ask the replica what it applied when it has not said yet; ``POST /-/reconfigure``
        when that is not ``version``. Both on a CONTROL channel (the replica's handshake)."""
        done = False
        try:
            if uid not in self.user_configs:
                status, answer = await channel.request(
                    ip,
                    contract.REPLICA_PORT,
                    "GET",
                    wire.HEALTHZ_PATH,
                    secret,
                    pod_name,
                    timeout_s=_RECONFIGURE_TIMEOUT_S,
                )
                reported = wire.applied_user_config(answer) if status == 200 else None
                if reported is not None:
                    self.user_configs[uid] = reported
                    if not needs_push(reported, version):
                        done = True
                        return
            status, answer = await channel.request(
                ip,
                contract.REPLICA_PORT,
                "POST",
                wire.RECONFIGURE_PATH,
                secret,
                pod_name,
                body,
                timeout_s=_RECONFIGURE_TIMEOUT_S,
            )
            if status == 200:
                self.user_configs[uid] = wire.applied_user_config(answer) or version
                done = True
            else:
                text = answer.decode(errors="replace")[:512]
                log.warning("reconfigure of pod %s failed (%d): %s", uid, status, text)
        except channel.ChannelError as exc:
            log.warning("reconfigure of pod %s at %s: handshake failed: %s", uid, ip, exc)
            self.forget_secret(instance_uid)
        except (OSError, TimeoutError) as exc:
            log.warning("reconfigure of pod %s at %s failed: %s", uid, ip, exc)
        finally:
            if done:
                self.on_pushed(pod)
            else:  # the replica may not listen yet: its application's next pass asks again
                asyncio.get_running_loop().call_later(_RETRY_S, self.on_pushed, pod)


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _secret_value(obj: dict[str, Any] | None) -> bytes | None:
    raw = ((obj or {}).get("data") or {}).get(contract.DATA_PLANE_SECRET_KEY)
    if not raw:
        return None
    try:
        value = base64.b64decode(raw, validate=True).strip()
    except (binascii.Error, ValueError):
        return None
    return value if len(value) >= channel.MIN_SECRET_BYTES else None
