"""The Kubernetes backend: custom resources as desired state, pods as replicas and proxies.

Contract shared by the operator, the renderer, the in-cluster data plane and the install manifests
(change it here first, then in :mod:`kubeserve.runtime.kubernetes.contract`, where the code of both
sides takes every name, label, variable and port from):

Resources (group ``kubeserve.io``, version ``v1beta1``, namespaced; models in
:mod:`kubeserve.schema.resources`): one ``ServeInstance`` per namespace (usually ``default``) owns
the proxies; each ``ServeApplication`` names its instance in ``spec.instance`` and is owned by it.

Children, all with an ownerReference to the CR they come from (garbage collection on delete):

* per instance ``<inst>``: the Secret ``<inst>-dataplane-secret`` (key ``secret``: the data-plane
  handshake key, 64 hex characters, created once by the operator, immutable); the
  NetworkPolicies ``<inst>-replicas`` and (with proxies) ``<inst>-proxies``; unless
  ``proxyLocation: Disabled``, proxy Deployment ``<inst>-proxy`` (``HeadOnly``: 1 replica) or
  DaemonSet (``EveryNode``), and Service ``<inst>-proxy`` on ``httpOptions.port``;
* per distinct build input ``<k>`` of an instance ``<inst>`` (a digest of what the build reads:
  the instance, its image and pull policy, import path, runtime_env, args and tracing_config, so
  a change of overrides or user_config reuses the last build, and applications of the same code
  share one): build Job ``<inst>-build-<k>`` that imports the application in its image and
  runtime_env and writes the graph (``kubeserve build`` JSON) to the ConfigMap of the same name;
  both owned (not controlled) by every application using them, so collected with the last;
* per serve deployment ``<dep>`` of application ``<app>``: Deployment (DaemonSet when
  ``is_driver_deployment``) and headless Service, both named :func:`workload_name` ``(app, dep)``.

Labels (all children): ``app.kubernetes.io/name=kubeserve``,
``app.kubernetes.io/managed-by=kubeserve``, ``app.kubernetes.io/component`` in
``proxy | replica | build``, ``kubeserve.io/instance=<inst>``; replicas also
``kubeserve.io/application=<app CR name>`` (a shared build names no application); replicas
``kubeserve.io/deployment=<label-safe deployment name>``. The EndpointSlice controller copies a
Service's labels onto its slices, so proxies find replica endpoints by these labels.

Pods: every container gets ``KUBESERVE_POD_IP`` (fieldRef ``status.podIP``) and
``KUBESERVE_BIND_HOST=0.0.0.0``: ``kubeserve replica --host $(KUBESERVE_BIND_HOST) --port 8000``
and ``kubeserve proxy --host $(KUBESERVE_BIND_HOST) --port <httpOptions.port> --discovery
kubernetes`` (all addresses of the pod's own network namespace; the tests' single-node cluster
runs these pods on a real kubelet and containerd, from the image the ``Dockerfile`` builds).
Proxies and replicas get ``KUBESERVE_DATA_PLANE_SECRET`` by ``secretKeyRef`` from the instance's
Secret; port 8000 of a replica speaks only behind that handshake
(:mod:`kubeserve.runtime.channel`), so its probes are ``GET /-/healthz`` on the unauthenticated
container port ``probe`` (8081, :mod:`kubeserve.runtime.replica.probe`); the proxy's are on its own
port. Every pod runs as UID 10001 with a read-only root filesystem and an ``emptyDir`` at ``/tmp``.
``KUBESERVE_NAMESPACE`` (fieldRef ``metadata.namespace``) tells in-cluster processes where their
CRs are.

``user_config`` is never in a pod template: the operator pushes it to ``POST /-/reconfigure`` on
a ``CONTROL`` channel to each ready replica (and again after a change), reporting the deployment
``UPDATING`` until all have applied it. Data-plane RBAC is per instance: ``<inst>-dataplane``
(read ServeApplications and EndpointSlices) and ``<inst>-build`` (create ConfigMaps).
"""
