"""Test application whose import fails: it imports a module that does not exist."""

import kubeserve_no_such_module  # noqa: F401
