"""Bound deployments and the application graph they form.

``Deployment.bind(*args, **kwargs)`` returns an :class:`Application`: a node holding the deployment
and its constructor arguments. Nodes nested in the arguments (directly or inside lists, tuples and
dict values) are edges of the graph; the outermost node is the ingress. In a replica every nested
node is replaced by a :class:`~kubeserve.sdk.handle.DeploymentHandle` to that deployment
(:func:`map_nodes`).

Invariant: within one graph a deployment name identifies exactly one node. The same node object may
be passed to several parents (it is one deployment); two distinct nodes with the same name are an
error, because one name can have only one set of constructor arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from kubeserve.sdk.deployment import Deployment


class GraphError(ValueError):
    """The application graph is malformed (for example, two different nodes share a name)."""


class GraphNode(NamedTuple):
    """One deployment of an application graph, as :meth:`Application.deployments` lists it."""

    name: str
    deployment: Deployment
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Application:
    """A deployment bound to its constructor arguments: a node, and the root of its own graph."""

    __slots__ = ("_args", "_deployment", "_kwargs")

    def __init__(
        self, deployment: Deployment, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._deployment = deployment
        self._args = tuple(args)
        self._kwargs = dict(kwargs)

    @property
    def deployment(self) -> Deployment:
        return self._deployment

    @property
    def name(self) -> str:
        """The name of this node's deployment (the ingress name when this node is the root)."""
        return self._deployment.name

    @property
    def args(self) -> tuple[Any, ...]:
        return self._args

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self._kwargs)

    def children(self) -> list[Application]:
        """The nodes this one receives handles to, in argument order, each once."""
        found: list[Application] = []

        def visit(node: Application) -> Application:
            if not any(node is seen for seen in found):
                found.append(node)
            return node

        map_nodes((self._args, self._kwargs), visit)
        return found

    def deployments(self) -> list[GraphNode]:
        """Every deployment of the graph: the ingress first, then depth-first in argument order.

        Raises :class:`GraphError` when two different nodes share a deployment name.
        """
        by_name: dict[str, Application] = {}
        order: list[Application] = []
        stack: list[Application] = [self]
        while stack:
            node = stack.pop()
            known = by_name.get(node.name)
            if known is not None:
                if known is not node:
                    raise GraphError(
                        f"two different deployments are named {node.name!r} in one application; "
                        "bind it once and pass the same node, or rename one with "
                        f".options(name=...) ({known!r} vs {node!r})"
                    )
                continue
            by_name[node.name] = node
            order.append(node)
            stack.extend(reversed(node.children()))
        return [GraphNode(n.name, n.deployment, n.args, n.kwargs) for n in order]

    def __repr__(self) -> str:
        return (
            f"Application({self._deployment.name!r}, args={self._args!r}, kwargs={self._kwargs!r})"
        )


def map_nodes(value: Any, replace: Callable[[Application], Any]) -> Any:
    """``value`` with every nested :class:`Application` replaced by ``replace(node)``.

    Walks lists, tuples and dict values (keys are left alone); other objects are returned as they
    are, so user objects are never copied. Containers without nodes come back as equal copies.
    """
    if isinstance(value, Application):
        return replace(value)
    if isinstance(value, list):
        return [map_nodes(item, replace) for item in value]
    if isinstance(value, tuple):
        items = [map_nodes(item, replace) for item in value]
        if hasattr(value, "_fields"):  # a NamedTuple keeps its type
            return type(value)(*items)
        return tuple(items)
    if isinstance(value, dict):
        return {key: map_nodes(item, replace) for key, item in value.items()}
    return value
