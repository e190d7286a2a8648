"""The data plane's side of Kubernetes: what proxies, replicas and build Jobs do in a cluster.

* :mod:`.contract`: the names, labels, environment variables, ports and keys that the operator
  (:mod:`kubeserve.backends.kubernetes`) writes and the processes in its pods read; the one place
  both sides import them from;
* :mod:`.client`: a small JSON client of the Kubernetes API (the operator's too);
* :mod:`.discovery`: routes and replica endpoints from ``ServeApplication`` status and
  EndpointSlices, for proxies and handles;
* :mod:`.replica`: what a replica learns from the cluster at start-up;
* :mod:`.graph`: the ConfigMap a build Job leaves the application graph in;
* :mod:`.pod`: ``kubeserve proxy|replica|build``, the data-plane commands given all of the above.

The rest of :mod:`kubeserve.runtime` never imports this package (an import-linter contract): the
commands are handed what the cluster provides by :mod:`.pod`, their composition root.

This package is part of every data-plane pod, so it never imports operator code
(:mod:`kubeserve.backends`); importing it (or :mod:`.contract`, :mod:`.replica`) loads no
Kubernetes client, so replicas on one machine do not pay for it.
"""
