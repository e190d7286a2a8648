"""kubeserve.api."""
