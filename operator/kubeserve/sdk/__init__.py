"""kubeserve.sdk."""
