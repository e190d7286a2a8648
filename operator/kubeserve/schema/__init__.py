"""kubeserve.schema."""
