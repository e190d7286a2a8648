"""kubeserve.control."""
