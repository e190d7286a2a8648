"""kubeserve.backends."""
