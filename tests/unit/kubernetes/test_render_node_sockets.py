"""``ServeInstance.spec.proxy.nodeLocalSockets``: what the proxy and replica pods get (pure).

Replica pods mount the node's directory of the instance's replica sockets and run, first, the one
init container that is not restricted (root with ``CHOWN`` only) to hand it to the pods' user;
proxy pods mount it only. Without the option nothing of it is rendered; unset, the operator's
choice decides (the namespace admitted a dry run of :func:`~.render_pod.node_sockets_probe`)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]

from kubeserve.backends.kubernetes import render, render_pod
from kubeserve.runtime import local_socket
from kubeserve.runtime.kubernetes import contract
from support.rendered_pods import K8S_VERSION, env, proxy_pod, replica_pod
from support.rendered_pods import instance as instance_with

HOST_PATH = "/run/kubeserve/serving/default"
Json = dict[str, Any]


def instance(**proxy: Any) -> render.InstanceView:
    return instance_with(proxy=proxy) if proxy else instance_with()


def node_volume(spec: Json) -> list[Json]:
    return [v for v in spec["volumes"] if "hostPath" in v]


def test_replica_pods_listen_in_the_nodes_directory() -> None:
    spec = replica_pod(instance(nodeLocalSockets=True))
    volume = {"name": "node-sockets", "hostPath": {"path": HOST_PATH, "type": "DirectoryOrCreate"}}
    assert node_volume(spec) == [volume]
    main = spec["containers"][0]
    mount = {"name": "node-sockets", "mountPath": contract.NODE_SOCKETS_DIR}
    assert mount in main["volumeMounts"]
    variables = env(main)
    assert variables[local_socket.NODE_SOCKETS_ENV] == contract.NODE_SOCKETS_DIR
    # the address callers know the replica by: its pod IP, defined earlier in the same list
    assert variables[local_socket.NODE_ADDRESS_ENV] == f"$({contract.POD_IP_ENV})"
    names = [e["name"] for e in main["env"]]
    assert names.index(contract.POD_IP_ENV) < names.index(local_socket.NODE_ADDRESS_ENV)
    # the directory goes to the pods' user before anything runs, by the least privilege that can
    claim = spec["initContainers"][0]
    assert claim["name"] == "node-sockets" and claim["volumeMounts"] == [mount]
    security = claim["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert security["runAsUser"] == 0 and security["runAsNonRoot"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert claim["command"][-2:] == [contract.NODE_SOCKETS_DIR, "10001"]


def test_the_claim_comes_before_the_runtime_env_fetch() -> None:
    spec = replica_pod(
        instance(nodeLocalSockets=True), runtime_env={"working_dir": "https://example.com/a.zip"}
    )
    assert [c["name"] for c in spec["initContainers"]] == ["node-sockets", "runtime-env"]


def test_proxy_pods_mount_it_without_a_claim() -> None:
    spec = proxy_pod(instance(nodeLocalSockets=True))
    assert len(node_volume(spec)) == 1
    assert "initContainers" not in spec
    variables = env(spec["containers"][0])
    assert variables[local_socket.NODE_SOCKETS_ENV] == contract.NODE_SOCKETS_DIR


def test_without_the_option_pods_stay_restricted() -> None:
    for inst in (instance(), instance(nodeLocalSockets=False), instance(dataPath="native")):
        for spec in (replica_pod(inst), proxy_pod(inst)):
            assert node_volume(spec) == []
            assert "initContainers" not in spec
            assert local_socket.NODE_SOCKETS_ENV not in env(spec["containers"][0])


def test_the_claim_is_idempotent_and_mode_first() -> None:
    """Run as root without CAP_FOWNER, the program changes the mode while root owns the
    directory, then the owner; a directory already the pods' user's is left alone."""
    import os
    import subprocess
    import sys
    import tempfile

    command = replica_pod(instance(nodeLocalSockets=True))["initContainers"][0]["command"]
    program = command[2]
    with tempfile.TemporaryDirectory() as tmp:
        uid = os.getuid()
        os.chmod(tmp, 0o755)
        # the directory already belongs to the given user: nothing is changed
        subprocess.run([sys.executable, "-c", program, tmp, str(uid)], check=True)
        assert os.stat(tmp).st_mode & 0o777 == 0o755
        if uid == 0:  # as root: handed over to another user, 0700
            subprocess.run([sys.executable, "-c", program, tmp, "10001"], check=True)
            st = os.stat(tmp)
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (10001, 10001, 0o700)


def test_unset_the_operators_choice_decides_and_the_spec_overrides_it() -> None:
    """``spec.proxy.nodeLocalSockets`` unset: the operator's choice (the namespace admitted the
    probe); set either way, the spec wins over it."""
    meta = {"name": "default", "namespace": "serving", "uid": "uid-inst"}

    def view(admitted: bool, **proxy: Any) -> render.InstanceView:
        spec = {"proxyLocation": "HeadOnly", **({"proxy": proxy} if proxy else {})}
        return render.instance_view({"metadata": meta, "spec": spec}, sockets_admitted=admitted)

    assert view(True).node_local_sockets is True
    assert node_volume(replica_pod(view(True))) and node_volume(proxy_pod(view(True)))
    assert view(False).node_local_sockets is False
    assert view(True, dataPath="native").node_local_sockets is True
    assert view(True, nodeLocalSockets=False).node_local_sockets is False
    assert view(False, nodeLocalSockets=True).node_local_sockets is True


def test_the_admission_probe_is_a_replica_pod_s_socket_part_under_its_account() -> None:
    """The dry-run Pod: the hostPath and the root init container exactly as a replica pod has
    them, the pods' security context, the data-plane account, no token; a valid Pod."""
    probe = render_pod.node_sockets_probe(
        "serving", "default", "kubeserve:dev", "Never", "kubeserve-dataplane-default"
    )
    kubernetes_validate.validate(probe, K8S_VERSION, strict=True)
    assert probe["metadata"] == {"name": render_pod.NODE_SOCKETS_PROBE, "namespace": "serving"}
    spec = probe["spec"]
    replica = replica_pod(instance(nodeLocalSockets=True))
    assert node_volume(spec) == node_volume(replica)
    assert spec["initContainers"][0] == replica["initContainers"][0] | {
        "image": "kubeserve:dev",
        "imagePullPolicy": "Never",
    }
    assert spec["securityContext"] == replica["securityContext"]
    assert spec["serviceAccountName"] == "kubeserve-dataplane-default"
    assert spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["command"] == ["true"]
