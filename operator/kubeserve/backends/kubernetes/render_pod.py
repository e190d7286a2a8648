"""The pieces of a pod spec shared by replica, build and proxy pods (pure).

Conventions every kubeserve pod follows:

* environment, in this order (later entries may refer to earlier ones as ``$(NAME)``):
  ``KUBESERVE_POD_IP`` (``status.podIP``), ``KUBESERVE_POD_NAME`` (``metadata.name``),
  ``KUBESERVE_NAMESPACE`` (``metadata.namespace``); then the user's ``runtime_env.env_vars``
  sorted by name, with every ``$`` doubled so Kubernetes never expands them (Ray treats them as
  literals); then kubeserve's own variables, which win over a user variable of the same name
  (a name appears once: server-side apply rejects duplicates);
* the restricted Pod Security Standard: non-root UID :data:`POD_UID`, no privilege escalation,
  every capability dropped, the ``RuntimeDefault`` seccomp profile; the root filesystem is
  read-only, and an ``emptyDir`` at ``/tmp`` (:data:`TMP_DIR`) is the scratch space of every
  container (the runtime_env files below have their own);
* proxies and replicas (not builds, not the init container) get the instance's data-plane secret
  as ``KUBESERVE_DATA_PLANE_SECRET`` from the Secret
  :func:`~kubeserve.runtime.kubernetes.contract.dataplane_secret_name`;
* ``working_dir`` / ``py_modules`` of a runtime_env are fetched by the init container
  ``runtime-env`` running ``kubeserve fetch-runtime-env --dest /var/run/kubeserve/runtime-env
  [--working-dir URI] [--py-module URI]...`` into an ``emptyDir`` mounted at that path in both
  containers. When it exits 0, ``<dest>/working_dir`` is the root of the working_dir (after the
  single-top-level-directory unwrapping of :mod:`kubeserve.runtime.runtime_env`) and
  ``<dest>/py_modules/<i>`` the import root of the i-th module (a directory or a symlink into
  ``<dest>``); the main container runs in ``<dest>/working_dir`` with ``PYTHONPATH`` listing the
  working_dir then the modules in order, as the local backend does.

* ``pip`` / ``uv`` packages are installed by the same init container (``--packages`` with the
  field as JSON), with the image's own uv, into the same ``emptyDir``: ``<dest>/python`` is the
  environment's ``site`` directory, last on ``PYTHONPATH`` (after the working_dir and modules), as
  the local backend orders it. uv's cache is ``<dest>/.uv-cache`` (one volume: files are hard
  links); indexes are the image's configuration (pip's and uv's) and the runtime_env's
  ``env_vars`` (``PIP_INDEX_URL``, ``UV_INDEX_URL``...), which the init container has. The init
  container's log tail is its termination message (``FallbackToLogsOnError``), which the
  deployment's status repeats when it fails.

* with ``spec.proxy.nodeLocalSockets`` (:func:`with_node_sockets`), proxies and replicas mount
  the node's directory of the instance's replica sockets (a ``hostPath``) at
  :data:`~kubeserve.runtime.kubernetes.contract.NODE_SOCKETS_DIR` and name it, and the pod's IP,
  in the variables of :mod:`kubeserve.runtime.local_socket`; a replica pod first runs the init
  container ``node-sockets``, as root with only ``CHOWN``, which hands the directory (created by
  the kubelet, root's) to :data:`POD_UID`, mode 0700.

* with ``spec.logs.accessLines: File`` (the default; :func:`with_access_log_file`), proxies and
  replicas write their access lines to
  :data:`~kubeserve.runtime.kubernetes.contract.ACCESS_LOG_FILE`, rotated at the log limits of
  :mod:`kubeserve.runtime.logs` (16 MiB, 4 kept), in an ``emptyDir`` whose ``sizeLimit``
  (:data:`ACCESS_LOG_SIZE_LIMIT`) holds them all; the container's output keeps the records.

``image_uri`` picks the image; ``excludes`` and ``config`` need no action; any other runtime_env key
(``conda``, ``container``...) is refused with a :class:`RenderError` that says to build it into an
image instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeserve.backends.kubernetes.render_views import RenderError
from kubeserve.runtime import channel, local_socket, logs
from kubeserve.runtime.kubernetes import contract
from kubeserve.runtime.kubernetes.contract import (
    BIND_HOST,
    BIND_HOST_ENV,
    NAMESPACE_ENV,
    POD_IP_ENV,
    POD_NAME_ENV,
)
from kubeserve.schema import node_labels
from kubeserve.schema.packages import package_spec

__all__ = [
    "ACCELERATOR_LABEL",
    "EXTENDED_RESOURCE_PREFIX",
    "FETCH_RUNTIME_ENV_COMMAND",
    "GPU_RESOURCE",
    "POD_UID",
    "RUNTIME_ENV_DIR",
    "STARTUP_TIMEOUT_S",
    "TMP_DIR",
    "Manifest",
    "container",
    "data_plane_secret_env",
    "environment",
    "escape",
    "field_env",
    "image_for",
    "node_scheduling",
    "node_selector",
    "per_node_cap",
    "pod_spec",
    "resources",
    "seconds",
    "user_pod_spec",
    "with_access_log_file",
    "with_node_sockets",
]

Manifest = dict[str, Any]

#: The non-root user and group every kubeserve container runs as (the image should use it too).
POD_UID = 10001
RUNTIME_ENV_DIR = "/var/run/kubeserve/runtime-env"
#: The root filesystem is read-only; this ``emptyDir`` is every container's scratch space.
TMP_DIR = "/tmp"
_TMP_VOLUME = "tmp"
_RUNTIME_ENV_VOLUME = "runtime-env"
_SECRET_VOLUME = "pickled-graph"
_NODE_SOCKETS_VOLUME = "node-sockets"
_ACCESS_LOG_VOLUME = "access-log"
#: the access log's ``emptyDir`` holds its files at their limits (the current one and the rotated
#: ones kept: 5 x 16 MiB) and a rollover's slack; past it the kubelet would evict the pod
ACCESS_LOG_SIZE_LIMIT = f"{(logs.DEFAULT_LOG_BACKUPS + 1) * logs.DEFAULT_LOG_BYTES // 2**20 + 16}Mi"
#: The ``node-sockets`` init container's program: the directory to :data:`POD_UID`, 0700 (as
#: root without CAP_FOWNER, the mode is changed while root still owns it), once.
_CLAIM_NODE_SOCKETS = (
    "import os,sys\n"
    "d,u=sys.argv[1],int(sys.argv[2])\n"
    "if os.stat(d).st_uid!=u:\n"
    " os.chmod(d,0o700);os.chown(d,u,u)"
)
#: readable by the pod's user and group (``fsGroup``) only
_SECRET_FILE_MODE = 0o440
FETCH_RUNTIME_ENV_COMMAND = ["kubeserve", "fetch-runtime-env", "--dest", RUNTIME_ENV_DIR]
#: ``<dest>/python``: the ``site`` directory of the runtime_env's pip / uv environment
PYTHON_ENV_LINK = "python"

GPU_RESOURCE = "nvidia.com/gpu"
#: Ray custom resources without a ``/`` become extended resources under this prefix.
EXTENDED_RESOURCE_PREFIX = "kubeserve.io/"
#: Node label matched by ``ray_actor_options.accelerator_type``.
ACCELERATOR_LABEL = "kubeserve.io/accelerator-type"
#: How long a replica may take to answer its first health check before it is restarted.
STARTUP_TIMEOUT_S = 600

_NO_OP_KEYS = frozenset({"excludes", "config", "image_uri"})
_FILE_KEYS = frozenset({"working_dir", "py_modules", "pip", "uv"})
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_RESOURCE_NAME = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME_PART}")


# --------------------------------------------------------------------------- environment


def escape(text: str) -> str:
    """``text`` as a literal in ``env`` values, ``command`` and ``args`` (no ``$(VAR)``)."""
    return text.replace("$", "$$")


def field_env() -> list[Manifest]:
    """The pod's address, name and namespace, then the bind address, first in every container."""
    fields: list[Manifest] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in (
            (POD_IP_ENV, "status.podIP"),
            (POD_NAME_ENV, "metadata.name"),
            (NAMESPACE_ENV, "metadata.namespace"),
        )
    ]
    return [*fields, {"name": BIND_HOST_ENV, "value": BIND_HOST}]


def environment(
    user: Mapping[str, str], own: Mapping[str, str], refs: Sequence[Manifest] = ()
) -> list[Manifest]:
    """Field references, then the user's variables (literal), then ``own`` (expanded; wins),
    then ``refs`` (``valueFrom`` entries such as :func:`data_plane_secret_env`; win too)."""
    entries = field_env()
    reserved = {e["name"] for e in entries} | set(own) | {r["name"] for r in refs}
    entries += [
        {"name": k, "value": escape(v)} for k, v in sorted(user.items()) if k not in reserved
    ]
    entries += [{"name": k, "value": v} for k, v in own.items()]
    return entries + list(refs)


def data_plane_secret_env(instance: str) -> Manifest:
    """``KUBESERVE_DATA_PLANE_SECRET`` from the instance's data-plane Secret (a ``secretKeyRef``:
    the value is never part of a pod spec; the process removes it from its environment)."""
    ref = {"name": contract.dataplane_secret_name(instance), "key": contract.DATA_PLANE_SECRET_KEY}
    return {"name": channel.SECRET_ENV, "valueFrom": {"secretKeyRef": ref}}


# --------------------------------------------------------------------------- runtime_env


def image_for(runtime_env: Mapping[str, Any], default: str, field: str) -> str:
    """``runtime_env.image_uri`` when set, else ``default``."""
    image = runtime_env.get("image_uri")
    if image is None:
        return default
    if not isinstance(image, str) or not image:
        raise RenderError(f"{field}.image_uri must be a non-empty image reference")
    return image


def _check_runtime_env(runtime_env: Mapping[str, Any], field: str) -> None:
    given = {k for k, v in runtime_env.items() if v is not None}
    unsupported = sorted(given - _NO_OP_KEYS - _FILE_KEYS - {"env_vars"})
    if unsupported:
        raise RenderError(
            f"{field}: {', '.join(unsupported)} cannot be honoured on Kubernetes; build the "
            f"dependencies into an image and set {field}.image_uri"
        )


@dataclass(frozen=True)
class _RuntimeEnvFiles:
    """``working_dir`` / ``py_modules`` / packages of a runtime_env, for the init container."""

    working_dir: str | None
    py_modules: tuple[str, ...]
    #: ``{"pip": ...}`` or ``{"uv": ...}`` as given (None: no packages)
    packages: Mapping[str, Any] | None = None

    @property
    def python_path(self) -> str:
        roots = [f"{RUNTIME_ENV_DIR}/working_dir"] if self.working_dir else []
        roots += [f"{RUNTIME_ENV_DIR}/py_modules/{i}" for i in range(len(self.py_modules))]
        roots += [f"{RUNTIME_ENV_DIR}/{PYTHON_ENV_LINK}"] if self.packages else []
        return ":".join(roots)

    def fetch_command(self) -> list[str]:
        command = list(FETCH_RUNTIME_ENV_COMMAND)
        if self.working_dir:
            command += ["--working-dir", escape(self.working_dir)]
        for uri in self.py_modules:
            command += ["--py-module", escape(uri)]
        if self.packages:
            command += ["--packages", escape(json.dumps(self.packages, sort_keys=True))]
        return command

    def mount(self) -> Manifest:
        return {"name": _RUNTIME_ENV_VOLUME, "mountPath": RUNTIME_ENV_DIR}


def _runtime_env_files(runtime_env: Mapping[str, Any], field: str) -> _RuntimeEnvFiles | None:
    working_dir = runtime_env.get("working_dir")
    modules = tuple(runtime_env.get("py_modules") or ())
    try:
        spec = package_spec(runtime_env)
    except ValueError as err:
        raise RenderError(f"{field}: {err}") from err
    packages = None if spec is None else {str(spec.installer): runtime_env[spec.installer]}
    if not working_dir and not modules and packages is None:
        return None
    return _RuntimeEnvFiles(working_dir=working_dir or None, py_modules=modules, packages=packages)


# --------------------------------------------------------------------------- resources


def seconds(value: Any) -> int:
    """A duration in whole seconds for a probe field (rounded up; at least 1)."""
    return max(1, math.ceil(float(value)))


def _count(value: float) -> str:
    """An integer quantity; fractions round up (Kubernetes counts devices in whole units)."""
    return str(math.ceil(round(value, 6)))


def _cpu(value: float) -> str:
    millis = math.ceil(round(value * 1000, 6))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _extended_resource(name: str) -> str:
    full = name if "/" in name else EXTENDED_RESOURCE_PREFIX + name
    if not _RESOURCE_NAME.fullmatch(full) or full.startswith("kubernetes.io/"):
        raise RenderError(
            f"ray_actor_options.resources: {name!r} is not a valid Kubernetes extended resource "
            f"name (a name without '/' becomes {EXTENDED_RESOURCE_PREFIX}<name>)"
        )
    return full


def resources(options: Mapping[str, Any]) -> Manifest:
    """Container resources from ``ray_actor_options``.

    ``num_cpus`` -> ``requests.cpu`` only (no CPU limit: throttling hurts latency more than sharing
    spare cycles); ``memory`` (bytes) -> requests and limits; ``num_gpus`` -> ``nvidia.com/gpu``
    and each custom resource -> an extended resource (``<name>`` as given when it contains a
    ``/``, else ``kubeserve.io/<name>``), requests equal to limits and fractions rounded up to
    whole units, since Kubernetes cannot share a device. ``object_store_memory`` has no meaning
    without Ray's object store and is ignored.
    """
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if options.get("num_cpus"):
        requests["cpu"] = _cpu(float(options["num_cpus"]))
    if options.get("memory"):
        requests["memory"] = limits["memory"] = _count(float(options["memory"]))
    devices = {GPU_RESOURCE: options.get("num_gpus")}
    devices |= {_extended_resource(k): v for k, v in (options.get("resources") or {}).items()}
    for name, amount in sorted(devices.items()):
        if amount:
            requests[name] = limits[name] = _count(float(amount))
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def node_selector(options: Mapping[str, Any]) -> dict[str, str]:
    """``accelerator_type`` -> the node label :data:`ACCELERATOR_LABEL` (nodes must carry it)."""
    accelerator = options.get("accelerator_type")
    if not accelerator:
        return {}
    if not isinstance(accelerator, str) or not node_labels.valid_value(accelerator):
        raise RenderError(
            f"ray_actor_options.accelerator_type {accelerator!r} is not a valid node label value"
        )
    return {ACCELERATOR_LABEL: accelerator}


def node_scheduling(options: Mapping[str, Any]) -> Manifest:
    """The pod fields that choose a replica's node: ``accelerator_type`` and Ray 2.60's
    ``label_selector`` (node labels on Kubernetes, :mod:`kubeserve.schema.node_labels`).

    A plain value is a ``nodeSelector`` entry; ``!v``, ``in(a, b)`` and ``!in(a, b)`` are
    required node affinity (``NotIn`` / ``In``; as in Ray, a node without the label passes a
    ``!`` condition).
    """
    selector = node_selector(options)
    expressions: list[Manifest] = []
    try:
        conditions = node_labels.parse_selector(options.get("label_selector"))
    except ValueError as exc:
        raise RenderError(f"ray_actor_options.label_selector {exc}") from None
    for condition in conditions:
        if condition.plain:
            selector[condition.key] = condition.values[0]
        else:
            expressions.append(
                {
                    "key": condition.key,
                    "operator": condition.operator,
                    "values": list(condition.values),
                }
            )
    fields: Manifest = {"nodeSelector": selector} if selector else {}
    if expressions:
        terms = [{"matchExpressions": expressions}]
        required = {"nodeSelectorTerms": terms}
        fields["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
    return fields


#: ``minDomains`` of the per-node cap: more nodes than any cluster has, so the scheduler always
#: counts the global minimum as 0 and ``maxSkew`` is the most replicas a node may hold.
_EVERY_NODE = 1_000_000


def per_node_cap(max_replicas_per_node: int | None, selector: Mapping[str, str]) -> Manifest:
    """Ray's ``max_replicas_per_node`` as a hard topology spread constraint on
    ``kubernetes.io/hostname``: at most that many replicas of the deployment (of one revision,
    so a roll is never stuck behind the replicas it replaces) on any node; replicas beyond what
    the nodes hold stay Pending, as Ray's stay pending."""
    if max_replicas_per_node is None:
        return {}
    constraint = {
        "maxSkew": max_replicas_per_node,
        "minDomains": _EVERY_NODE,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": dict(selector)},
        "matchLabelKeys": ["pod-template-hash"],
    }
    return {"topologySpreadConstraints": [constraint]}


# --------------------------------------------------------------------------- containers and pods


def _container_security() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": POD_UID,
        "runAsGroup": POD_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": POD_UID,
        "runAsGroup": POD_UID,
        "fsGroup": POD_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container(
    name: str, image: str, pull_policy: str | None, command: list[str], env: list[Manifest]
) -> Manifest:
    """A container with kubeserve's security context; callers add ports, probes, resources."""
    spec: Manifest = {"name": name, "image": image, "command": command, "env": env}
    if pull_policy:
        spec["imagePullPolicy"] = pull_policy
    spec["securityContext"] = _container_security()
    return spec


def _with_tmp(spec: Manifest) -> Manifest:
    mounts = [*spec.get("volumeMounts", []), {"name": _TMP_VOLUME, "mountPath": TMP_DIR}]
    return {**spec, "volumeMounts": mounts}


def pod_spec(
    containers: list[Manifest],
    service_account: str,
    *,
    init_containers: Sequence[Manifest] = (),
    volumes: Sequence[Manifest] = (),
    **fields: Any,
) -> Manifest:
    """A pod spec running as ``service_account`` under the restricted security profile, with a
    read-only root filesystem and an ``emptyDir`` at :data:`TMP_DIR` in every container."""
    spec: Manifest = {
        "serviceAccountName": service_account,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
    }
    if init_containers:
        spec["initContainers"] = [_with_tmp(c) for c in init_containers]
    spec["containers"] = [_with_tmp(c) for c in containers]
    spec["volumes"] = [{"name": _TMP_VOLUME, "emptyDir": {}}, *volumes]
    return spec | fields


def with_node_sockets(
    spec: Manifest, namespace: str, instance: str, *, owner: bool = False
) -> Manifest:
    """``spec`` (a pod spec from :func:`pod_spec`) with the node's directory of ``instance``'s
    replica sockets mounted into its first container and named in its environment; ``owner``
    (replica pods, which create sockets there): with the init container that hands it to the
    pods' user, first of the init containers."""
    mount = {"name": _NODE_SOCKETS_VOLUME, "mountPath": contract.NODE_SOCKETS_DIR}
    env = [
        {"name": local_socket.NODE_SOCKETS_ENV, "value": contract.NODE_SOCKETS_DIR},
        {"name": local_socket.NODE_ADDRESS_ENV, "value": f"$({POD_IP_ENV})"},
    ]
    path = contract.node_sockets_host_path(namespace, instance)
    source = {"hostPath": {"path": path, "type": "DirectoryOrCreate"}}
    out = _with_volume(spec, mount, source, env)
    main = out["containers"][0]
    if owner:
        claim = {
            "name": "node-sockets",
            "image": main["image"],
            "command": ["python3", "-c", _CLAIM_NODE_SOCKETS, contract.NODE_SOCKETS_DIR,
                        str(POD_UID)],
            "securityContext": {
                **_container_security(),
                "runAsNonRoot": False,
                "runAsUser": 0,
                "runAsGroup": 0,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
            },
            "volumeMounts": [mount],
        }  # fmt: skip
        if "imagePullPolicy" in main:
            claim["imagePullPolicy"] = main["imagePullPolicy"]
        out["initContainers"] = [claim, *spec.get("initContainers", [])]
    return out


#: The name of :func:`node_sockets_probe` (a dry run creates nothing, so it never clashes).
NODE_SOCKETS_PROBE = "kubeserve-node-sockets-probe"


def node_sockets_probe(
    namespace: str, instance: str, image: str, pull_policy: str | None, service_account: str
) -> Manifest:
    """A Pod with what node-local sockets add to ``instance``'s replica pods (the node's directory
    as a ``hostPath``, the root init container with ``CHOWN``) under their security context and
    ``service_account``: the operator sends it as a server-side dry run (``dryRun=All``, never
    created) to learn whether the namespace's admission (Pod Security, policy webhooks) admits
    such pods."""
    main = container("probe", image, pull_policy, ["true"], [])
    spec = pod_spec([main], service_account, automountServiceAccountToken=False)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": NODE_SOCKETS_PROBE, "namespace": namespace},
        "spec": with_node_sockets(spec, namespace, instance, owner=True),
    }


def with_access_log_file(spec: Manifest) -> Manifest:
    """``spec`` (a pod spec from :func:`pod_spec`) whose first container writes its access lines
    to :data:`~kubeserve.runtime.kubernetes.contract.ACCESS_LOG_FILE` (an ``emptyDir``) instead
    of its output."""
    mount = {"name": _ACCESS_LOG_VOLUME, "mountPath": contract.ACCESS_LOG_DIR}
    env = [{"name": logs.ACCESS_LOG_FILE_ENV, "value": contract.ACCESS_LOG_FILE}]
    return _with_volume(spec, mount, {"emptyDir": {"sizeLimit": ACCESS_LOG_SIZE_LIMIT}}, env)


def _with_volume(
    spec: Manifest, mount: Manifest, source: Manifest, env: list[Manifest]
) -> Manifest:
    """``spec`` with a volume (``mount``'s name, ``source`` its kind) mounted into its first
    container at ``mount``, and ``env`` after that container's variables."""
    main, *others = spec["containers"]
    mounts = [*main.get("volumeMounts", []), mount]
    main = {**main, "env": [*main["env"], *env], "volumeMounts": mounts}
    volume = {"name": mount["name"], **source}
    return {**spec, "containers": [main, *others], "volumes": [*spec["volumes"], volume]}


def user_pod_spec(
    main: Manifest,
    runtime_env: Mapping[str, Any],
    own_env: Mapping[str, str],
    service_account: str,
    *,
    field: str,
    refs: Sequence[Manifest] = (),
    secret_mount: tuple[str, str] | None = None,
    **fields: Any,
) -> Manifest:
    """The pod spec of a container running user code (a replica or a build) in ``runtime_env``.

    ``main`` is a :func:`container` without ``env``; it gets the environment (user variables,
    then ``own_env``, then ``refs``), the fetched files when ``working_dir``/``py_modules``
    are set, and ``secret_mount`` (Secret name, directory) mounted read-only. ``field`` is the
    runtime_env's path in the spec, for error messages.
    """
    _check_runtime_env(runtime_env, field)
    user_vars: Mapping[str, str] = runtime_env.get("env_vars") or {}
    files = _runtime_env_files(runtime_env, field)
    mounts: list[Manifest] = []
    volumes: list[Manifest] = []
    if secret_mount is not None:
        secret, directory = secret_mount
        mounts.append({"name": _SECRET_VOLUME, "mountPath": directory, "readOnly": True})
        source = {"secretName": secret, "defaultMode": _SECRET_FILE_MODE}
        volumes.append({"name": _SECRET_VOLUME, "secret": source})
    if files is None:
        main = {**main, "env": environment(user_vars, own_env, refs)}
        if mounts:
            main["volumeMounts"] = mounts
        return pod_spec([main], service_account, volumes=volumes, **fields)
    python_path = files.python_path
    if "PYTHONPATH" in user_vars:
        python_path += ":" + escape(user_vars["PYTHONPATH"])
    main = {
        **main,
        "env": environment(user_vars, {**own_env, "PYTHONPATH": python_path}, refs),
        "volumeMounts": [files.mount(), *mounts],
    }
    if files.working_dir:
        main["workingDir"] = f"{RUNTIME_ENV_DIR}/working_dir"
    fetch = container(
        _RUNTIME_ENV_VOLUME, main["image"], main.get("imagePullPolicy"), files.fetch_command(), []
    )
    fetch |= {
        "env": environment(user_vars, {"UV_CACHE_DIR": f"{RUNTIME_ENV_DIR}/.uv-cache"}),
        "volumeMounts": [files.mount()],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    volumes.append({"name": _RUNTIME_ENV_VOLUME, "emptyDir": {}})
    return pod_spec([main], service_account, init_containers=[fetch], volumes=volumes, **fields)
