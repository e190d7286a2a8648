"""Replica placement on one machine: what a replica claims, whether it fits, how many start now.

The local backend schedules replicas the way Ray schedules Serve replicas on a single node: each
replica claims ``ray_actor_options.num_cpus`` (Ray Serve's default: 1), ``num_gpus`` (default 0)
``memory`` (bytes), its custom ``resources`` and, for an ``accelerator_type``, a sliver of the
node's ``accelerator_type:<type>`` resource (Ray's own encoding) from the instance's resources
(``kubeserve start --num-cpus``, ``--num-gpus``, ``--memory`` and ``--resources``, like ``ray
start``; a detected GPU's model gives the node its ``accelerator_type:<type>``, as Ray's raylet
does). A replica that does not fit is not started; it waits, its deployment stays ``UPDATING``
with :func:`unschedulable_message`, and it starts once resources free up.

GPUs are devices, not only a count: a replica claiming ``num_gpus`` is given devices by
:func:`assign_gpus` (whole ones for a whole number, a share of one device for a fraction, as Ray
packs fractional GPU actors) and sees exactly them in ``CUDA_VISIBLE_DEVICES``.

``max_replicas_per_node`` holds as Ray holds it on a one-node cluster: the instance is one node,
so at most that many replicas of the deployment (of any version, stopping ones included, as Ray
counts live actors) exist at once; the others wait with :func:`per_node_cap_message`.

Independently of resources, at most ``start_slots`` replicas of the whole instance are starting at
once, so an accepted large count is paced instead of forking hundreds of interpreters together, and
none starts while the machine's available memory is under :func:`memory_reserve`.
Everything here is pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kubeserve.control.effective_config import EffectiveDeployment
from kubeserve.schema import node_labels

#: The resources every instance has, in Ray's spelling, each with its own ``kubeserve start``
#: flag rather than a ``--resources`` entry (as ``ray start``); custom ones come from
#: ``--resources`` and ``ray_actor_options.resources``.
FLAGGED = {"CPU": "--num-cpus", "GPU": "--num-gpus", "memory": "--memory"}
#: Ray Serve 2.60's ``num_cpus`` of a replica whose options do not set it.
DEFAULT_REPLICA_CPUS = 1.0
#: How Ray names the resource a node of an accelerator type has (1) and a claim of it takes.
ACCELERATOR_PREFIX = "accelerator_type:"
ACCELERATOR_CLAIM = 0.001
_EPSILON = 1e-9
#: An NVIDIA device name's model token: the first all-capitals/digits words after the vendor
#: ("Tesla V100-SXM2-16GB" -> "V100", "NVIDIA A100-SXM4-40GB" -> "A100").
_NVIDIA_MODEL = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")


def replica_claim(config: EffectiveDeployment) -> dict[str, float]:
    """What one replica of a deployment (its effective config) takes from the instance."""
    options = config.ray_actor_options
    cpus = options.get("num_cpus")
    claim = {
        "CPU": float(DEFAULT_REPLICA_CPUS if cpus is None else cpus),
        "GPU": float(options.get("num_gpus") or 0.0),
    }
    memory = options.get("memory")
    if memory:
        claim["memory"] = float(int(memory))  # Ray counts it in whole bytes
    for kind, amount in (options.get("resources") or {}).items():
        if kind not in claim and amount:
            claim[kind] = float(amount)
    accelerator = options.get("accelerator_type")
    if accelerator:
        claim[ACCELERATOR_PREFIX + accelerator] = ACCELERATOR_CLAIM
    return claim


def accelerator_type(gpu_name: str) -> str | None:
    """The ``accelerator_type`` of an NVIDIA device by its name, as Ray derives a node's: the
    model token ("NVIDIA A100-SXM4-40GB" -> "A100", "NVIDIA RTX PRO 6000 ..." ->
    "RTX-PRO-6000"), else the product name without the vendor, hyphenated ("NVIDIA GeForce RTX
    5090" -> "GeForce-RTX-5090")."""
    match = _NVIDIA_MODEL.match(gpu_name)
    model = match.group(1).replace(" ", "-") if match else ""
    if len(model) > 1:
        return model
    product = re.sub(r"^NVIDIA\s+", "", gpu_name).strip()
    return product.replace(" ", "-") or None


def custom_resources(text: str) -> dict[str, float]:
    """``kubeserve start --resources`` as ``ray start --resources`` takes it: a JSON object of
    resource names and non-negative amounts (CPUs, GPUs and memory have flags of their own);
    ``ValueError`` saying what is wrong."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"--resources: {text!r} is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError('--resources: a JSON object of names and amounts, such as {"custom": 2}')
    resources: dict[str, float] = {}
    for name, amount in value.items():
        if name in FLAGGED:
            raise ValueError(f"--resources: give {name} with {FLAGGED[name]}")
        if name == "object_store_memory":
            raise ValueError("--resources: object_store_memory: there is no object store")
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not amount >= 0:
            raise ValueError(f"--resources: {name!r}: {amount!r} is not a non-negative number")
        resources[name] = float(amount)
    return resources


def fits(claim: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(need <= free.get(kind, 0.0) + _EPSILON for kind, need in claim.items())


def admit(
    missing: int,
    claim: Mapping[str, float],
    free: Mapping[str, float],
    start_slots: int,
    node_room: int | None = None,
) -> tuple[int, int]:
    """How many of ``missing`` replicas start now, and how many cannot fit at all right now.

    Returns ``(start, unschedulable)``: ``start`` is bounded by the free resources, by
    ``node_room`` (how many more replicas of the deployment the node may hold, None: no cap) and
    by the free ``start_slots``; ``unschedulable`` counts the replicas the free resources or the
    cap cannot hold (those held back only by pacing are neither: they start on a later pass).
    """
    if missing <= 0:
        return 0, 0
    fitting = missing if node_room is None else min(missing, max(0, node_room))
    for kind, need in claim.items():
        if need > _EPSILON:
            fitting = min(fitting, int((free.get(kind, 0.0) + _EPSILON) // need))
    fitting = max(0, fitting)
    return min(fitting, max(0, start_slots)), missing - fitting


def gpu_devices(count: float, visible: list[str]) -> list[str]:
    """The device ids of an instance with ``count`` GPUs: the first of ``visible`` (the ids this
    process may use, as ``CUDA_VISIBLE_DEVICES`` or the driver names them), then numbers after
    the highest given, as ``ray start --num-gpus`` numbers devices it was told exist."""
    whole = int(count + _EPSILON)
    devices = list(visible[:whole])
    numbers = [int(d) for d in devices if d.isdigit()]
    following = max(numbers, default=-1) + 1
    while len(devices) < whole:
        devices.append(str(following))
        following += 1
    return devices


def assign_gpus(need: float, free: Mapping[str, float]) -> list[str] | None:
    """The devices a replica claiming ``need`` GPUs gets, given each device's free share
    (``free``, in device order); None when they cannot be found now.

    A whole number takes that many entirely free devices, in order. A fraction takes a share of
    the one device where it fits most tightly (so fractions pack together, leaving whole devices
    for whole claims), Ray's behaviour for fractional GPU actors. No GPU claimed: no device.
    """
    if need <= _EPSILON:
        return []
    if need < 1.0 - _EPSILON:
        fitting = [(share, d) for d, share in free.items() if share + _EPSILON >= need]
        if not fitting:
            return None
        return [min(fitting, key=lambda pair: pair[0])[1]]
    whole = [d for d, share in free.items() if share >= 1.0 - _EPSILON]
    count = int(need + _EPSILON)
    return whole[:count] if len(whole) >= count else None


def unschedulable_message(
    app: str,
    deployment: str,
    count: int,
    claim: Mapping[str, float],
    free: Mapping[str, float],
    total: Mapping[str, float],
) -> str:
    """The status message of a deployment with replicas that do not fit (Ray's wording, plus the
    way out)."""
    required = {kind: need for kind, need in claim.items() if need > 0}
    available = {kind: max(0.0, free.get(kind, 0.0)) for kind in required}
    instance = {kind: total.get(kind, 0.0) for kind in required}
    return _cannot_schedule(app, deployment, count) + (
        f"resources required for each replica: {json.dumps(required)}, "
        f"total resources available: {json.dumps(available)} "
        f"(this kubeserve instance has {json.dumps(instance)}; lower num_replicas or "
        "ray_actor_options, stop other applications, or restart kubeserve with more "
        "--num-cpus/--num-gpus/--memory/--resources)."
    )


def _cannot_schedule(app: str, deployment: str, count: int) -> str:
    """The start every message of replicas that wait has (Ray's wording), up to the reason."""
    plural = "replica" if count == 1 else "replicas"
    return (
        f"Deployment '{deployment}' in application '{app}' has {count} {plural} that cannot be "
        "scheduled: "
    )


def node_room(max_replicas_per_node: int | None, on_node: int) -> int | None:
    """How many more replicas of a deployment with ``on_node`` replicas may start on the node
    (None: the deployment has no cap)."""
    if max_replicas_per_node is None:
        return None
    return max(0, max_replicas_per_node - on_node)


def per_node_cap_message(app: str, deployment: str, count: int, cap: int) -> str:
    """The status message of a deployment with replicas beyond ``max_replicas_per_node`` of the
    one node a kubeserve start instance is (they stay pending, as in Ray)."""
    return _cannot_schedule(app, deployment, count) + (
        f"max_replicas_per_node is {cap} and this kubeserve instance is one node "
        f"(lower num_replicas to {cap} or raise max_replicas_per_node; on Kubernetes the "
        "replicas spread over the nodes)."
    )


def label_selector_message(
    app: str, deployment: str, count: int, selector: Mapping[str, str], labels: Mapping[str, str]
) -> str:
    """The status message of a deployment whose ``label_selector`` this node's labels do not
    satisfy (its replicas stay pending, as in Ray)."""
    return _cannot_schedule(app, deployment, count) + (
        f"ray_actor_options.label_selector {json.dumps(dict(selector))} does not "
        f"match this kubeserve instance's node labels {json.dumps(dict(labels))} (change the "
        'selector, or restart kubeserve with --labels "key=value,...")'
    )


#: Memory kept free on the machine whatever the claims say: a replica is a whole interpreter (tens
#: of MB), and replicas claiming no CPU (``num_cpus: 0``) are otherwise unbounded.
MIN_FREE_MEMORY_BYTES = 256 * 2**20
MIN_FREE_MEMORY_FRACTION = 0.05


def memory_reserve(total_bytes: int) -> int:
    """Bytes of memory no replica start may eat into."""
    return max(MIN_FREE_MEMORY_BYTES, int(total_bytes * MIN_FREE_MEMORY_FRACTION))


def low_memory_message(
    app: str, deployment: str, count: int, available_bytes: int, total_bytes: int
) -> str:
    """The status message of a deployment whose replicas wait because memory runs low."""
    mib = 2**20
    plural = "replica" if count == 1 else "replicas"
    return (
        f"Deployment '{deployment}' in application '{app}' has {count} {plural} waiting to start: "
        f"the machine has {available_bytes // mib} MiB of memory available and kubeserve keeps "
        f"{memory_reserve(total_bytes) // mib} MiB free (of {total_bytes // mib} MiB); lower "
        "num_replicas or stop other applications."
    )


@dataclass(frozen=True)
class Node:
    """What the one node of a ``kubeserve start`` instance offers right now."""

    free: Mapping[str, float]
    total: Mapping[str, float]
    #: each GPU device's free share, in device order (see :func:`assign_gpus`)
    gpu_free: Mapping[str, float]
    labels: Mapping[str, str]
    start_slots: int
    #: (available, total) bytes when the machine's memory is too low to start a replica
    low_memory: tuple[int, int] | None = None


@dataclass(frozen=True)
class Placement:
    """What a deployment missing replicas does on this pass: start ``start`` of them, say why
    ``waiting`` others cannot be scheduled (``reason``, "" when none waits), and whether to stop
    one replica of the old version to make room for the new one (a roll on a full node)."""

    start: int
    waiting: int = 0
    reason: str = ""
    make_room: bool = False


def place(
    app: str,
    deployment: str,
    config: EffectiveDeployment,
    missing: int,
    node: Node,
    on_node: int,
    old_serving: bool,
) -> Placement:
    """Ray's one-node scheduling of ``missing`` replicas of a deployment with ``on_node``
    replicas already there (any version, stopping ones included). In order: the node's labels
    must satisfy ``label_selector`` (else none starts: no stop makes room for it), the machine
    must have memory to start an interpreter, then as many start as the cap
    (``max_replicas_per_node``), the free resources, the GPU devices and the start slots allow.
    ``old_serving``: replicas of an older version serve and none is stopping, so one of them may
    be stopped to make room, which only helps a claim the node's totals can hold at all."""
    selector = config.ray_actor_options.get("label_selector")
    if selector and not node_labels.matches(node_labels.parse_selector(selector), node.labels):
        reason = label_selector_message(app, deployment, missing, selector, node.labels)
        return Placement(0, missing, reason)
    if node.low_memory is not None:
        return Placement(0, missing, low_memory_message(app, deployment, missing, *node.low_memory))
    claim = replica_claim(config)
    cap = config.max_replicas_per_node
    room = node_room(cap, on_node)
    start, waiting = admit(missing, claim, node.free, node.start_slots, room)
    devices = dict(node.gpu_free)
    for started in range(start):  # the GPUs may be free in sum and not on few enough devices
        given = assign_gpus(claim.get("GPU", 0.0), devices)
        if given is None:
            start, waiting = started, waiting + start - started
            break
        for device in given:
            devices[device] -= min(claim["GPU"], 1.0)
    if not waiting:
        return Placement(start)
    if cap is not None and room is not None and room < missing:  # the cap holds them back
        reason = per_node_cap_message(app, deployment, waiting, cap)
    else:
        left = {kind: free - start * claim.get(kind, 0.0) for kind, free in node.free.items()}
        reason = unschedulable_message(app, deployment, waiting, claim, left, node.total)
    make_room = start == 0 and old_serving and fits(claim, node.total)
    return Placement(start, waiting, reason, make_room)
