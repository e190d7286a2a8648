"""Compatibility layers that let code written for other serving systems run on kubeserve.

:mod:`kubeserve.compat.ray` is what ``import ray`` resolves to in kubeserve's processes (see
:mod:`kubeserve.sdk.ray_namespace`).
"""
