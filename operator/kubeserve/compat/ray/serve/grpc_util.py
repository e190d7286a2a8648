"""``ray.serve.grpc_util``: what a deployment served by the gRPC proxy is given.

A method that declares a ``grpc_context`` argument receives the call's
:class:`RayServegRPCContext`; what it sets there (status code, details, trailing metadata) is what
the client's call ends with (:mod:`kubeserve.runtime.proxy.grpc_ingress`). A client-streaming or
bidirectional method receives the client's messages as a :class:`gRPCInputStream`.
"""

from __future__ import annotations

from kubeserve.compat.ray import not_provided
from kubeserve.sdk.grpc_context import RayServegRPCContext, gRPCInputStream

__all__ = ["RayServegRPCContext", "gRPCInputStream"]

__getattr__ = not_provided.module_getattr(__name__)
