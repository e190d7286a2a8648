"""What users import to write an application: ``@deployment``, ``.bind()``, handles, HTTP types.

Re-exported from :mod:`kubeserve` (user code writes ``from kubeserve import deployment``), each
name loaded at its first use. This package imports none of its modules itself: the proxy and the
replicas import the few they need (:mod:`~kubeserve.sdk.context`...) without loading the rest.
"""
