"""kubeserve.runtime."""
