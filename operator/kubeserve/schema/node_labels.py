"""Node labels and Ray 2.60's ``ray_actor_options.label_selector`` (pure).

A selector maps a label key to a condition on the node's value of it: ``v`` (equal), ``!v`` (not
equal, or no such label), ``in(a, b)`` (one of them) and ``!in(a, b)`` (none of them, or no such
label), as Ray 2.60 writes them. Keys and values follow Kubernetes label syntax, as Ray checks
them. On Kubernetes a selector becomes the pod's ``nodeSelector`` and node affinity
(:func:`kubeserve.backends.kubernetes.render_pod.node_scheduling`); a ``kubeserve start``
instance is one node, whose labels ``kubeserve start --labels "k=v,k2=v2"`` gives (as
``ray start --labels``): a replica whose selector they do not satisfy waits, as Ray's stays
pending.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["LabelCondition", "matches", "parse_labels", "parse_selector", "valid_key"]

_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME_PART}")
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
#: Ray 2.60's label selector values: ``v``, ``!v``, ``in(a, b)``, ``!in(a, b)``.
_CONDITION = re.compile(r"(?P<not>!)?(?:in\((?P<set>[^()]*)\)|(?P<one>[^()!]*))")


@dataclass(frozen=True)
class LabelCondition:
    key: str
    operator: Literal["In", "NotIn"]
    values: tuple[str, ...]
    #: a plain value (``v``): a ``nodeSelector`` entry on Kubernetes
    plain: bool = False


def valid_key(key: str) -> bool:
    return bool(_KEY.fullmatch(key))


def valid_value(value: str) -> bool:
    return bool(_VALUE.fullmatch(value))


def parse_selector(selector: Mapping[str, str] | None) -> list[LabelCondition]:
    """The conditions of ``selector``, in key order; ``ValueError`` naming the first key whose
    condition is not one (the message starts with the key, quoted)."""
    conditions = []
    for key, value in sorted((selector or {}).items()):
        match = _CONDITION.fullmatch(str(value))
        if match is None:
            values: list[str] = []
        elif match["set"] is not None:
            values = [v.strip() for v in match["set"].split(",")]
        else:
            values = [match["one"]]
        if match is None or not valid_key(key) or not all(v and valid_value(v) for v in values):
            raise ValueError(
                f"{key!r}: {value!r} is not a node label condition (a label value, !value, "
                "in(a, b) or !in(a, b), keys and values in Kubernetes label syntax)"
            )
        plain = match["not"] is None and match["set"] is None
        operator: Literal["In", "NotIn"] = "NotIn" if match["not"] else "In"
        conditions.append(LabelCondition(key, operator, tuple(values), plain))
    return conditions


def matches(conditions: list[LabelCondition], labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies every condition (a node without the label
    satisfies a ``!`` condition, as in Ray and in Kubernetes' ``NotIn``)."""
    for condition in conditions:
        value = labels.get(condition.key)
        if (value in condition.values) != (condition.operator == "In"):
            return False
    return True


def parse_labels(text: str) -> dict[str, str]:
    """``ray start --labels``' spelling, ``"k=v,k2=v2"``, as a dict; ``ValueError`` saying
    which pair is wrong."""
    labels: dict[str, str] = {}
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] == '"':
        text = text[1:-1]
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (part.strip() for part in pair.partition("="))
        if not sep or "=" in value:
            raise ValueError(f"{pair!r} is not a key=value pair")
        if not valid_key(key):
            raise ValueError(f"{key!r} is not a label key (Kubernetes label syntax)")
        if not valid_value(value):
            raise ValueError(f"{value!r} (of {key!r}) is not a label value")
        labels[key] = value
    return labels
