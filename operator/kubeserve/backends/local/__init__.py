"""kubeserve.backends.local."""
