"""What tests and benchmarks share: processes of kubeserve, Kubernetes clusters, HTTP and waiting.

Importable as ``support`` by the tests (pytest's ``pythonpath``) and by the benchmarks (``make
venv`` puts ``tests/`` on the virtualenv's path, as an editable install does), so neither edits
``sys.path``:

* :mod:`.common`: ``ROOT``, ``free_port``, ``wait_for``, ``http``, ``pid_alive``, ``run`` (an
  asyncio runner) and ``wait_until`` (its async twin of ``wait_for``);
* :mod:`.kubeserve_start`: a real ``kubeserve start`` process and the apps tests deploy;
* :mod:`.channel_front`: the data-plane handshake in front of a plain test server;
* :mod:`.static_source`: an endpoint source of one fixed snapshot;
* :mod:`.browser`: headless Chromium over the DevTools protocol;
* :mod:`.k8s_control_plane`, :mod:`.node_cluster`, :mod:`.k8s_operator`:
  the Kubernetes tier's clusters and operator;
* :mod:`.kubeserve_install`: the rendered Helm chart and the plain manifests.
"""
