"""Rendering of kubeserve's custom resources into Kubernetes objects (pure, no cluster).

Every rendered object is also validated against the Kubernetes OpenAPI schemas (strict: unknown
fields are errors) of the version the kubernetes test tier runs.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from kubeserve.backends.kubernetes import render
from kubeserve.control import effective_config
from kubeserve.runtime.kubernetes import contract

K8S_VERSION = "1.36.0"
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
#: the quantities kubeserve writes (the OpenAPI schema does not check a quantity's syntax)
QUANTITY = re.compile(r"[0-9]+(m|Mi)?")

Json = dict[str, Any]


# --------------------------------------------------------------------------- builders


GRPC_OPTIONS = {"port": 9001, "grpcServicerFunctions": ["protos_pb2_grpc.add_S_to_server"]}


#: every proxy and replica pod's access log (``spec.logs.accessLines: File``, the default)
ACCESS_LOG_VOLUME: Json = {"name": "access-log", "emptyDir": {"sizeLimit": "96Mi"}}
ACCESS_LOG_MOUNT: Json = {"name": "access-log", "mountPath": "/var/log/kubeserve"}


def instance(**spec: Any) -> render.InstanceView:
    return render.instance_view(
        {"metadata": {"name": "default", "namespace": "serving", "uid": "uid-inst"}, "spec": spec}
    )


def app_config(**fields: Any) -> Json:
    return {"name": "shop", "import_path": "shop.main:app", **fields}


#: an application deployed with serve.run, as ServeApplicationSpec.app_config gives it
IMPERATIVE: Json = {"name": "shop", "route_prefix": "/", "pickled_graph_sha256": "ab" * 32}


def app(
    config: Json | None = None, cr_name: str = "shop", inst: render.InstanceView | None = None
) -> render.AppView:
    """The view of an application of ``inst`` (its tracing_config: none by default)."""
    meta = {"name": cr_name, "namespace": "serving", "uid": "uid-app", "generation": 4}
    tracing = None if inst is None else inst.tracing_config
    return render.app_view({"metadata": meta}, config or app_config(), tracing)


def deployment(
    config: Json | None = None, name: str = "Model", code: Mapping[str, Any] | None = None
) -> render.DesiredDeployment:
    """A deployment of ``config`` (the app's REST config) with its overrides applied."""
    config = config or app_config()
    overrides = {d["name"]: d for d in config.get("deployments", [])}
    effective = effective_config.effective_deployment(name, code or {}, overrides.get(name))
    return render.deployment_view(config, effective)


def workload(config: Json | None = None, name: str = "Model", **code: Any) -> Json:
    return render.render_replica_workload(instance(), app(config), deployment(config, name, code))


def pod(obj: Json) -> Json:
    spec: Json = obj["spec"]["template"]["spec"]
    return spec


def main_container(obj: Json) -> Json:
    containers: list[Json] = pod(obj)["containers"]
    assert len(containers) == 1
    return containers[0]


def env(container: Json) -> dict[str, Any]:
    names_ = [e["name"] for e in container["env"]]
    assert len(names_) == len(set(names_)), "an env name appears twice"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` is a literal ``$``)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else variables.get(m.group(1), m.group(0)),
        text,
    )


def validate(obj: Json) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def everything() -> list[Json]:
    """A gallery covering every renderer and every optional branch."""
    runtime_env = {
        "working_dir": "https://example.com/shop.zip",
        "py_modules": ["https://example.com/lib.zip"],
        "env_vars": {"MODE": "prod"},
    }
    config = app_config(runtime_env=runtime_env)
    options = {
        "num_cpus": 2,
        "num_gpus": 1,
        "memory": 2**30,
        "accelerator_type": "A100",
        "resources": {"tpu": 1},
        "runtime_env": {"image_uri": "registry/shop:2"},
    }
    inst, view = instance(proxyLocation="HeadOnly"), app(config)
    objects = [
        render.render_replica_workload(
            inst, view, deployment(config, "Model", {"ray_actor_options": options})
        ),
        render.render_replica_workload(
            inst, view, deployment(config, "Driver", {"is_driver_deployment": True})
        ),
        render.render_replica_service(inst, view, deployment(config)),
        render.render_replica_disruption_budget(
            inst, view, deployment(config, code={"num_replicas": 2})
        ),
        render.render_build_job(inst, view),
        render.render_build_job(inst, app()),
        render.render_build_job(inst, app(IMPERATIVE)),
        render.render_replica_workload(inst, app(IMPERATIVE), deployment(IMPERATIVE)),
        render.render_policy_workload(inst, view),
        render.render_policy_workload(inst, app(IMPERATIVE)),
        *render.render_dataplane_rbac(inst),
        render.render_data_plane_secret(inst, "0123456789abcdef" * 4),
        *render.render_instance_network_policies(inst, "kubeserve-system"),
        *render.render_proxy(inst),
        *render.render_proxy(
            instance(proxyLocation="EveryNode", httpOptions={"port": 8080, "requestTimeoutS": 5})
        ),
        *render.render_proxy(instance(grpcOptions=GRPC_OPTIONS)),
        *render.render_instance_network_policies(
            instance(grpcOptions=GRPC_OPTIONS), "kubeserve-system"
        ),
    ]
    return objects


GALLERY = everything()


# --------------------------------------------------------------------------- schema and contract


@pytest.mark.parametrize("obj", GALLERY, ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_rendered_object_is_valid_kubernetes(obj: Json) -> None:
    validate(obj)
    template = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in template.get("containers", []) + template.get("initContainers", []):
        for amounts in container.get("resources", {}).values():
            assert all(QUANTITY.fullmatch(v) for v in amounts.values()), amounts


@pytest.mark.parametrize("obj", GALLERY, ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_has_a_valid_name_labels_and_an_owner(obj: Json) -> None:
    meta = obj["metadata"]
    assert DNS_1035.fullmatch(meta["name"]) and len(meta["name"]) <= 63
    assert meta["namespace"] == "serving"
    labels = meta["labels"]
    assert (
        labels[contract.NAME_LABEL] == "kubeserve"
        and labels[contract.MANAGED_BY_LABEL] == "kubeserve"
    )
    assert labels[contract.COMPONENT_LABEL] in {"proxy", "replica", "build", "autoscaling-policy"}
    assert labels[contract.INSTANCE_LABEL] == "default"
    [owner] = meta["ownerReferences"]
    expected = (
        "ServeApplication" if labels[contract.COMPONENT_LABEL] != "proxy" else "ServeInstance"
    )
    if obj["kind"] in {"ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy"}:
        expected = "ServeInstance"
    shared = obj["kind"] == "Job"  # one build for many applications
    assert owner["kind"] == expected and owner["controller"] is not shared
    assert owner["uid"] == ("uid-app" if expected == "ServeApplication" else "uid-inst")


@pytest.mark.parametrize(
    "obj",
    [o for o in GALLERY if "template" in o.get("spec", {})],
    ids=lambda o: o["metadata"]["name"],
)
def test_pods_run_restricted(obj: Json) -> None:
    spec = pod(obj)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "emptyDir": {}} in spec["volumes"]
    for container in spec["containers"] + spec.get("initContainers", []):
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["readOnlyRootFilesystem"] is True
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        # the read-only root leaves /tmp (and the runtime_env files) writable
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert env(container)["KUBESERVE_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env(container)["KUBESERVE_NAMESPACE"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}
        }
    if "selector" in obj["spec"]:  # a workload selects its own pods
        template_labels = obj["spec"]["template"]["metadata"]["labels"]
        assert obj["spec"]["selector"]["matchLabels"].items() <= template_labels.items()


# --------------------------------------------------------------------------- replica workloads


def test_replica_workload_contract() -> None:
    obj = workload(num_replicas=3)
    assert (obj["apiVersion"], obj["kind"], obj["spec"]["replicas"]) == ("apps/v1", "Deployment", 3)
    assert obj["metadata"]["name"] == contract.workload_name("shop", "Model")
    assert obj["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "kubeserve",
        "app.kubernetes.io/component": "replica",
        "kubeserve.io/application": "shop",
        "kubeserve.io/deployment": "Model",
    }
    container = main_container(obj)
    assert container["name"] == "replica"
    assert container["command"] == [
        "kubeserve",
        "replica",
        "--host",
        "$(KUBESERVE_BIND_HOST)",
        "--port",
        "8000",
    ]
    assert pod(obj)["serviceAccountName"] == "default-dataplane"
    variables = env(container)
    assert variables["KUBESERVE_DISCOVERY"] == "kubernetes"
    assert variables["KUBESERVE_APPLICATION"] == "shop"
    assert variables["KUBESERVE_INSTANCE"] == "default"


def test_replica_config_names_the_pod_and_leaves_user_config_out() -> None:
    config = app_config(name="Shop $(HOME)")
    obj = workload(config, user_config={"threshold": 1}, max_ongoing_requests=7)
    raw = env(main_container(obj))["KUBESERVE_REPLICA_CONFIG"]
    replica = json.loads(expand(raw, {"KUBESERVE_POD_NAME": "shop-model-abc12", "HOME": "/root"}))
    assert replica == {
        "app": "Shop $(HOME)",
        "deployment": "Model",
        "import_path": "shop.main:app",
        "replica_id": "shop-model-abc12",
        "user_config": None,
        "max_ongoing_requests": 7,
        "graceful_shutdown_wait_loop_s": 2.0,
        "graceful_shutdown_timeout_s": 20.0,
        "probe_port": 8081,
        "leave_delay_s": 2.0,
        "health_check_period_s": 10.0,
        "health_check_timeout_s": 30.0,
    }


def test_autoscaling_starts_at_initial_replicas_and_the_caller_may_override() -> None:
    obj = workload(autoscaling_config={"min_replicas": 1, "initial_replicas": 4, "max_replicas": 9})
    assert obj["spec"]["replicas"] == 4
    config = app_config()
    effective = effective_config.effective_deployment("Model", {}, None)
    view = render.deployment_view(config, effective, replicas=6)
    assert render.render_replica_workload(instance(), app(config), view)["spec"]["replicas"] == 6


def test_the_rollout_knobs_are_the_deployments_strategy_in_replicas() -> None:
    def rolling(**code: Any) -> Json:
        obj = workload(**code)
        validate(obj)
        assert obj["spec"]["strategy"]["type"] == "RollingUpdate"
        return dict(obj["spec"]["strategy"]["rollingUpdate"])

    # Ray's defaults: a fifth at a time, at least one (a percentage would round 0.2 of 4 to 0)
    assert rolling(num_replicas=4) == {"maxSurge": 0, "maxUnavailable": 1}
    assert rolling(num_replicas=10) == {"maxSurge": 0, "maxUnavailable": 2}
    assert rolling(num_replicas=4, rolling_update_percentage=0.5) == {
        "maxSurge": 0,
        "maxUnavailable": 2,
    }
    # a surge: none unavailable, the surge rounded up
    assert rolling(num_replicas=4, max_surge_percent=25) == {"maxSurge": 1, "maxUnavailable": 0}
    assert rolling(num_replicas=3, max_surge_percent=10) == {"maxSurge": 1, "maxUnavailable": 0}


def test_a_drain_evicts_at_most_what_a_roll_replaces_and_never_blocks() -> None:
    """The replicas' PodDisruptionBudget: ``maxUnavailable`` as the roll's, at least one."""
    inst, view = instance(), app(app_config())

    def budget(**code: Any) -> Json:
        config = app_config()
        obj = render.render_replica_disruption_budget(inst, view, deployment(config, code=code))
        assert obj is not None
        validate(obj)
        workload = render.render_replica_workload(inst, view, deployment(config, code=code))
        assert obj["spec"]["selector"] == workload["spec"]["selector"]
        assert obj["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        return dict(obj["spec"])

    assert budget(num_replicas=2)["maxUnavailable"] == 1
    assert budget(num_replicas=10)["maxUnavailable"] == 2
    assert budget(num_replicas=4, max_surge_percent=25)["maxUnavailable"] == 1
    config = app_config()
    driver = deployment(config, code={"is_driver_deployment": True})
    assert render.render_replica_disruption_budget(inst, view, driver) is None


def test_a_budget_that_could_never_refuse_an_eviction_is_not_made() -> None:
    """One replica (or none, or as many as the roll replaces at once): every pod may go
    whatever the budget says, so no budget (one object and its writes fewer per deployment)."""
    inst, view, config = instance(), app(app_config()), app_config()

    def budget(**code: Any) -> Json | None:
        return render.render_replica_disruption_budget(inst, view, deployment(config, code=code))

    assert budget(num_replicas=1) is None
    assert budget(num_replicas=0) is None
    assert budget(num_replicas=2, rolling_update_percentage=100, max_surge_percent=0) is None
    assert budget(num_replicas=2) is not None


def test_driver_deployment_is_a_daemonset() -> None:
    obj = workload(is_driver_deployment=True, num_replicas=3)
    assert obj["kind"] == "DaemonSet"
    assert "replicas" not in obj["spec"] and "strategy" not in obj["spec"]
    validate(obj)


def test_resources_from_actor_options() -> None:
    options = {
        "num_cpus": 0.25,
        "memory": 512 * 2**20,
        "num_gpus": 1.5,
        "resources": {"tpu": 2, "example.com/fpga": 0.5, "unused": 0},
    }
    resources = main_container(workload(ray_actor_options=options))["resources"]
    assert resources == {
        "requests": {
            "cpu": "250m",
            "memory": str(512 * 2**20),
            "nvidia.com/gpu": "2",
            "kubeserve.io/tpu": "2",
            "example.com/fpga": "1",
        },
        "limits": {
            "memory": str(512 * 2**20),
            "nvidia.com/gpu": "2",
            "kubeserve.io/tpu": "2",
            "example.com/fpga": "1",
        },
    }


def test_default_actor_options_request_one_cpu_and_no_limits() -> None:
    assert main_container(workload())["resources"] == {"requests": {"cpu": "1"}}
    assert main_container(workload(ray_actor_options={"num_cpus": 0}))["resources"] == {}


def test_invalid_custom_resource_name_is_a_render_error() -> None:
    with pytest.raises(render.RenderError, match="not a valid Kubernetes extended resource"):
        workload(ray_actor_options={"resources": {"two words": 1}})


def test_accelerator_type_is_a_node_selector() -> None:
    obj = workload(ray_actor_options={"accelerator_type": "H100"})
    assert pod(obj)["nodeSelector"] == {"kubeserve.io/accelerator-type": "H100"}
    assert "nodeSelector" not in pod(workload())
    with pytest.raises(render.RenderError, match="accelerator_type"):
        workload(ray_actor_options={"accelerator_type": "not a label"})


def test_label_selector_values_are_node_selectors_and_operators_node_affinity() -> None:
    selector = {"pool": "a", "zone": "!west", "gpu": "in(H100, A100)", "spot": "!in(yes)"}
    spec = pod(workload(ray_actor_options={"label_selector": selector}))
    assert spec["nodeSelector"] == {"pool": "a"}
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "gpu", "operator": "In", "values": ["H100", "A100"]},
                {"key": "spot", "operator": "NotIn", "values": ["yes"]},
                {"key": "zone", "operator": "NotIn", "values": ["west"]},
            ]
        }
    ]
    both = {"accelerator_type": "H100", "label_selector": {"pool": "a"}}
    assert pod(workload(ray_actor_options=both))["nodeSelector"] == {
        "kubeserve.io/accelerator-type": "H100",
        "pool": "a",
    }
    assert "affinity" not in pod(workload())


@pytest.mark.parametrize("value", ["in()", "!!a", "in(a,", "two words", "-a", ""])
def test_a_label_selector_kubernetes_cannot_express_is_a_render_error(value: str) -> None:
    with pytest.raises(render.RenderError, match="label_selector 'pool'"):
        workload(ray_actor_options={"label_selector": {"pool": value}})


def test_max_replicas_per_node_is_a_hard_spread_over_nodes() -> None:
    obj = workload(max_replicas_per_node=2)
    (constraint,) = pod(obj)["topologySpreadConstraints"]
    assert constraint["maxSkew"] == 2
    assert constraint["topologyKey"] == "kubernetes.io/hostname"
    assert constraint["whenUnsatisfiable"] == "DoNotSchedule"
    # more domains than any cluster has: the global minimum is 0, so maxSkew caps every node
    assert constraint["minDomains"] >= 100_000
    assert constraint["labelSelector"]["matchLabels"] == obj["spec"]["selector"]["matchLabels"]
    assert constraint["matchLabelKeys"] == ["pod-template-hash"]
    validate(obj)
    assert "topologySpreadConstraints" not in pod(workload())


def test_probes_follow_the_health_check_fields() -> None:
    container = main_container(workload(health_check_period_s=2.5, health_check_timeout_s=4))
    replica = json.loads(env(container)["KUBESERVE_REPLICA_CONFIG"].replace("$(", "("))
    assert (replica["health_check_period_s"], replica["health_check_timeout_s"]) == (2.5, 4.0)
    # kubelets cannot pass the data-plane handshake: probes go to the replica's probe listener
    assert {"name": "probe", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert replica["probe_port"] == 8081
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/-/healthz", "port": "probe"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["periodSeconds"] == 3
        assert container[probe]["timeoutSeconds"] == 4
    assert container["readinessProbe"]["failureThreshold"] == 1
    assert container["livenessProbe"]["failureThreshold"] == 3
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_the_grace_period_covers_the_leave_delay_and_graceful_shutdown_timeout() -> None:
    """2 s of serving on while proxies learn the pod leaves, the drain, 1 s to drop connections"""
    assert pod(workload(graceful_shutdown_timeout_s=7.2))["terminationGracePeriodSeconds"] == 11
    assert pod(workload())["terminationGracePeriodSeconds"] == 23


def test_env_vars_merge_app_then_deployment_and_stay_literal() -> None:
    config = app_config(runtime_env={"env_vars": {"A": "app", "B": "app", "PRICE": "$(5)"}})
    options = {"runtime_env": {"env_vars": {"B": "deployment", "KUBESERVE_DISCOVERY": "mine"}}}
    container = main_container(workload(config, ray_actor_options=options))
    variables = env(container)
    assert variables["A"] == "app" and variables["B"] == "deployment"
    assert expand(variables["PRICE"], {"5": "five"}) == "$(5)"
    assert variables["KUBESERVE_DISCOVERY"] == "kubernetes"  # kubeserve's own variables win
    order = [e["name"] for e in container["env"]]
    assert order[:3] == ["KUBESERVE_POD_IP", "KUBESERVE_POD_NAME", "KUBESERVE_NAMESPACE"]


def test_image_from_deployment_then_application_then_instance() -> None:
    assert main_container(workload())["image"] == "kubeserve:0.1.0"
    config = app_config(runtime_env={"image_uri": "registry/app:1"})
    assert main_container(workload(config))["image"] == "registry/app:1"
    options = {"runtime_env": {"image_uri": "registry/model:2"}}
    assert (
        main_container(workload(config, ray_actor_options=options))["image"] == "registry/model:2"
    )
    custom = instance(image="registry/kubeserve:9", imagePullPolicy="Always")
    obj = render.render_replica_workload(custom, app(), deployment())
    assert main_container(obj)["image"] == "registry/kubeserve:9"
    assert main_container(obj)["imagePullPolicy"] == "Always"


def test_working_dir_and_py_modules_are_fetched_by_an_init_container() -> None:
    runtime_env = {
        "working_dir": "https://example.com/src.zip",
        "py_modules": ["https://example.com/a.zip", "https://example.com/b.zip"],
        "env_vars": {"PYTHONPATH": "/opt/extra"},
    }
    obj = workload(app_config(runtime_env=runtime_env))
    spec = pod(obj)
    [init] = spec["initContainers"]
    assert init["name"] == "runtime-env"
    assert init["command"] == [
        "kubeserve",
        "fetch-runtime-env",
        "--dest",
        "/var/run/kubeserve/runtime-env",
        "--working-dir",
        "https://example.com/src.zip",
        "--py-module",
        "https://example.com/a.zip",
        "--py-module",
        "https://example.com/b.zip",
    ]
    assert spec["volumes"] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": "runtime-env", "emptyDir": {}},
        ACCESS_LOG_VOLUME,
    ]
    mount = {"name": "runtime-env", "mountPath": "/var/run/kubeserve/runtime-env"}
    tmp = {"name": "tmp", "mountPath": "/tmp"}
    container = main_container(obj)
    assert init["volumeMounts"] == [mount, tmp]
    assert container["volumeMounts"] == [mount, tmp, ACCESS_LOG_MOUNT]
    assert container["workingDir"] == "/var/run/kubeserve/runtime-env/working_dir"
    assert env(container)["PYTHONPATH"] == ":".join(
        [
            "/var/run/kubeserve/runtime-env/working_dir",
            "/var/run/kubeserve/runtime-env/py_modules/0",
            "/var/run/kubeserve/runtime-env/py_modules/1",
            "/opt/extra",
        ]
    )


def test_py_modules_alone_keep_the_image_working_directory() -> None:
    obj = workload(app_config(runtime_env={"py_modules": ["https://example.com/a.zip"]}))
    assert "workingDir" not in main_container(obj)
    assert env(main_container(obj))["PYTHONPATH"] == "/var/run/kubeserve/runtime-env/py_modules/0"


def test_no_init_container_without_remote_files() -> None:
    spec = pod(workload(app_config(runtime_env={"env_vars": {"A": "1"}})))
    assert "initContainers" not in spec
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {}}, ACCESS_LOG_VOLUME]
    assert "PYTHONPATH" not in env(spec["containers"][0])


def test_runtime_env_keys_kubernetes_cannot_honour_are_refused() -> None:
    with pytest.raises(render.RenderError, match=r"conda.*image_uri"):
        workload(app_config(runtime_env={"conda": {"dependencies": ["torch"]}}))


def test_pip_packages_are_installed_by_the_init_container_into_the_shared_volume() -> None:
    pip = {"packages": ["inflection==0.5.1", "-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/r.txt"]}
    runtime_env = {
        "working_dir": "https://example.com/src.zip",
        "pip": pip,
        "env_vars": {"PIP_INDEX_URL": "https://mirror.example/simple"},
    }
    spec = pod(workload(app_config(runtime_env=runtime_env)))
    [init] = spec["initContainers"]
    packages = json.dumps({"pip": pip}, sort_keys=True).replace("$", "$$")  # no $(VAR) expansion
    assert init["command"][-2:] == ["--packages", packages]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"  # the installer's tail
    init_env = env(init)
    # the index the runtime_env names reaches the installer; uv's cache shares the volume
    assert init_env["PIP_INDEX_URL"] == "https://mirror.example/simple"
    assert init_env["UV_CACHE_DIR"] == "/var/run/kubeserve/runtime-env/.uv-cache"
    main = spec["containers"][0]
    assert "UV_CACHE_DIR" not in env(main)
    assert env(main)["PYTHONPATH"] == (
        "/var/run/kubeserve/runtime-env/working_dir:/var/run/kubeserve/runtime-env/python"
    )


def test_uv_alone_gets_an_init_container_and_the_image_working_directory() -> None:
    obj = workload(app_config(runtime_env={"uv": ["inflection"]}))
    [init] = pod(obj)["initContainers"]
    assert init["command"][-2:] == ["--packages", '{"uv": ["inflection"]}']
    assert "workingDir" not in main_container(obj)
    assert env(main_container(obj))["PYTHONPATH"] == "/var/run/kubeserve/runtime-env/python"


def test_the_build_job_installs_the_same_packages() -> None:
    job = render.render_build_job(instance(), app(app_config(runtime_env={"pip": ["inflection"]})))
    [init] = pod(job)["initContainers"]
    assert init["command"][-2:] == ["--packages", '{"pip": ["inflection"]}']


def test_a_malformed_packages_field_is_a_render_error() -> None:
    with pytest.raises(render.RenderError, match="exclude each other"):
        workload(app_config(runtime_env={"pip": ["a"], "uv": ["b"]}))


# --------------------------------------------------------------------------- what changes what


def test_user_config_and_replica_count_changes_leave_the_template_identical() -> None:
    before = workload(app_config(deployments=[{"name": "Model", "user_config": {"v": 1}}]))
    after = workload(
        app_config(deployments=[{"name": "Model", "user_config": {"v": 2}, "num_replicas": 5}])
    )
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["metadata"] == before["metadata"]


def test_a_new_version_changes_the_template() -> None:
    before = workload()
    after = workload(ray_actor_options={"num_cpus": 2})
    old = before["spec"]["template"]["metadata"]["annotations"]["kubeserve.io/replica-version"]
    new = after["spec"]["template"]["metadata"]["annotations"]["kubeserve.io/replica-version"]
    assert old != new
    code_change = workload(app_config(import_path="shop.v2:app"))
    assert code_change["spec"]["template"] != before["spec"]["template"]


def test_a_change_to_one_deployment_leaves_the_others_objects_identical() -> None:
    def render_both(config: Json) -> dict[str, tuple[Json, Json]]:
        inst, view = instance(), app(config)
        out = {}
        for name in ("Model", "Ingress"):
            dep = deployment(config, name)
            out[name] = (
                render.render_replica_workload(inst, view, dep),
                render.render_replica_service(inst, view, dep),
            )
        return out

    before = render_both(app_config(deployments=[{"name": "Model", "num_replicas": 1}]))
    options = {"num_gpus": 1, "runtime_env": {"env_vars": {"X": "1"}}}
    after = render_both(
        app_config(
            deployments=[
                {
                    "name": "Model",
                    "num_replicas": 2,
                    "ray_actor_options": options,
                    "health_check_period_s": 3,
                }
            ]
        )
    )
    assert after["Ingress"] == before["Ingress"]
    assert after["Model"][0]["spec"]["template"] != before["Model"][0]["spec"]["template"]


# --------------------------------------------------------------------------- replica Services


def test_replica_service_is_headless_and_selects_the_workloads_pods() -> None:
    inst, view, dep = instance(), app(), deployment()
    service = render.render_replica_service(inst, view, dep)
    obj = render.render_replica_workload(inst, view, dep)
    assert service["metadata"]["name"] == obj["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is False
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == obj["spec"]["selector"]["matchLabels"]
    # the EndpointSlice controller copies these onto the slices proxies watch
    assert service["metadata"]["labels"] == obj["spec"]["template"]["metadata"]["labels"]


# --------------------------------------------------------------------------- proxies and RBAC


def test_no_proxies_when_disabled() -> None:
    assert render.render_proxy(instance(proxyLocation="Disabled")) == []


@pytest.mark.parametrize(
    ("location", "kind"), [("HeadOnly", "Deployment"), ("EveryNode", "DaemonSet")]
)
def test_proxies_per_location(location: str, kind: str) -> None:
    inst = instance(proxyLocation=location, httpOptions={"port": 8080, "keepAliveTimeoutS": 30})
    proxy, service = render.render_proxy(inst)
    assert (proxy["kind"], proxy["metadata"]["name"]) == (kind, "default-proxy")
    assert proxy["spec"].get("replicas") == (1 if kind == "Deployment" else None)
    # surge first: a new proxy that never gets Ready leaves the old one serving
    strategy = proxy["spec"]["strategy" if kind == "Deployment" else "updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    validate(proxy)
    container = main_container(proxy)
    assert container["command"] == [
        "kubeserve",
        "proxy",
        "--host",
        "$(KUBESERVE_BIND_HOST)",
        "--port",
        "8080",
        "--discovery",
        "kubernetes",
        "--replacement-wait-s",
        "60.0",
        "--leave-delay-s",
        "2.0",
        "--drain-timeout-s",
        "8.0",
        "--keep-alive-timeout-s",
        "30",
    ]
    # the grace period covers the wait for another proxy, the leave delay and the drain
    assert pod(proxy)["terminationGracePeriodSeconds"] >= 60 + 2 + 8
    assert env(container)["KUBESERVE_INSTANCE"] == "default"
    assert container["readinessProbe"]["httpGet"] == {"path": "/-/healthz", "port": 8080}
    assert pod(proxy)["serviceAccountName"] == "default-dataplane"
    assert (service["kind"], service["metadata"]["name"]) == ("Service", "default-proxy")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == proxy["spec"]["selector"]["matchLabels"]


def test_a_proxy_serving_grpc_has_a_grpc_port_on_its_service() -> None:
    inst = instance(proxyLocation="HeadOnly", grpcOptions=GRPC_OPTIONS)
    proxy, service = render.render_proxy(inst)
    command = main_container(proxy)["command"]
    at = command.index("--grpc-port")
    assert command[at : at + 4] == [
        "--grpc-port",
        "9001",
        "--grpc-servicer-function",
        "protos_pb2_grpc.add_S_to_server",
    ]
    ports = main_container(proxy)["ports"]
    assert {"name": "grpc", "containerPort": 9001, "protocol": "TCP"} in ports
    assert service["spec"]["ports"][1] == {
        "name": "grpc",
        "port": 9001,
        "targetPort": 9001,
        "protocol": "TCP",
        "appProtocol": "kubernetes.io/h2c",
    }
    policies = render.render_instance_network_policies(inst, "kubeserve-system")
    (proxies,) = [p for p in policies if p["metadata"]["name"].endswith("-proxies")]
    assert {"port": 9001, "protocol": "TCP"} in proxies["spec"]["ingress"][0]["ports"]
    # No servicer functions, no gRPC server (as in Ray): no port either.
    plain = instance(proxyLocation="HeadOnly", grpcOptions={"port": 9001})
    _, service = render.render_proxy(plain)
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


def test_proxy_default_location_is_every_node_on_port_8000() -> None:
    proxy, service = render.render_proxy(instance())
    assert proxy["kind"] == "DaemonSet"
    assert service["spec"]["ports"][0]["port"] == 8000


def test_dataplane_and_build_rbac_is_least_privilege() -> None:
    objects = {
        (o["kind"], o["metadata"]["name"]): o for o in render.render_dataplane_rbac(instance())
    }
    assert set(objects) == {
        (kind, name)
        for kind in ("ServiceAccount", "Role", "RoleBinding")
        for name in ("default-dataplane", "default-build")
    }
    read = ["get", "list", "watch"]
    assert objects["Role", "default-dataplane"]["rules"] == [
        {"apiGroups": ["kubeserve.io"], "resources": ["serveapplications"], "verbs": read},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
    ]
    assert objects["Role", "default-build"]["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}
    ]
    binding = objects["RoleBinding", "default-build"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "default-build",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "default-build", "namespace": "serving"}
    ]


# --------------------------------------------------------------------------- builds


def test_build_job() -> None:
    config = app_config(runtime_env={"env_vars": {"MODE": "prod"}, "image_uri": "registry/shop:3"})
    view = app(config)
    job = render.render_build_job(instance(), view)
    name = render.build_name(instance(), view)
    assert job["metadata"]["name"] == name
    assert name.startswith("default-build-")
    # shared by every application of the same build inputs: nothing in it names this one but
    # its first owner, which neither controls it nor blocks on it
    assert contract.APPLICATION_LABEL not in job["metadata"]["labels"]
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["name"], owner["controller"], owner["blockOwnerDeletion"]) == (
        "shop",
        False,
        False,
    )
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["ttlSecondsAfterFinished"] > 0 and spec["activeDeadlineSeconds"] > 0
    assert pod(job)["restartPolicy"] == "Never"
    assert pod(job)["serviceAccountName"] == "default-build"
    container = main_container(job)
    assert container["image"] == "registry/shop:3"
    assert container["command"] == [
        "kubeserve",
        "build",
        "shop.main:app",
        "--configmap",
        name,
        "--namespace",
        "$(KUBESERVE_NAMESPACE)",
    ]
    assert "KUBESERVE_APPLICATION" not in env(container)
    assert env(container)["MODE"] == "prod"
    assert "initContainers" not in pod(job)
    with_files = app(app_config(runtime_env={"working_dir": "https://example.com/src.zip"}))
    assert [
        c["name"] for c in pod(render.render_build_job(instance(), with_files))["initContainers"]
    ] == ["runtime-env"]


def test_build_key_changes_with_code_and_environment_only() -> None:
    base = app().build_key
    assert (
        app(app_config(deployments=[{"name": "Model", "user_config": {"a": 1}}])).build_key == base
    )
    assert app(app_config(import_path="shop.v2:app")).build_key != base
    assert app(app_config(runtime_env={"env_vars": {"A": "1"}})).build_key != base
    assert app(app_config(args={"size": 2})).build_key != base


def test_applications_of_the_same_build_inputs_share_one_build() -> None:
    """One build per distinct input: another application of the same code, environment and
    instance builds nothing of its own; a change of what the build reads is another build."""
    shared = render.build_name(instance(), app())
    other = dataclasses.replace(app(), cr_name="shop-2", uid="uid-2", config=dict(app_config()))
    assert render.build_name(instance(), other) == shared
    tuned = app(app_config(deployments=[{"name": "Model", "user_config": {"a": 1}}]))
    assert render.build_name(instance(), tuned) == shared
    for changed in (
        app(app_config(import_path="shop.v2:app")),
        app(app_config(runtime_env={"env_vars": {"A": "1"}})),
        app(app_config(args={"size": 2})),
    ):
        assert render.build_name(instance(), changed) != shared
    assert render.build_name(instance(image="kubeserve:other"), app()) != shared
    assert render.build_name(instance(imagePullPolicy="Always"), app()) != shared


def test_a_changed_tracing_config_is_a_new_build_but_not_new_code() -> None:
    """The build checks the instance's exporter where the application runs: a tracing_config
    changed later builds again (a bad exporter fails the application, its fix recovers it), and
    reverting finds the earlier build. Tracing off keeps the key an untraced build always had,
    and the policy host (which traces nothing) keeps running."""
    untraced = app(inst=instance(tracingConfig={"enabled": False, "exporterImportPath": "a:b"}))
    assert untraced.build_key == app().build_key == app().code_key
    keys = set()
    for exporter in ("otel_setup:exporters", "otel_setup:nowhere", "otel_setup:exporters"):
        traced = app(inst=instance(tracingConfig={"enabled": True, "exporterImportPath": exporter}))
        assert traced.code_key == app().code_key
        keys.add(traced.build_key)
        job = render.render_build_job(instance(), traced)
        assert job["metadata"]["name"] == render.build_name(instance(), traced)
        policy = render.render_policy_workload(instance(), traced)
        version = policy["spec"]["template"]["metadata"]["annotations"]
        assert version == {"kubeserve.io/replica-version": app().code_key}
    assert len(keys) == 2 and app().build_key not in keys
    sampled = instance(tracingConfig={"enabled": True, "samplingRatio": 0.5})
    assert app(inst=sampled).build_key not in keys


# --------------------------------------------------------------------------- the data-plane secret

SECRET_REF = {
    "name": "KUBESERVE_DATA_PLANE_SECRET",
    "valueFrom": {"secretKeyRef": {"name": "default-dataplane-secret", "key": "secret"}},
}


def test_proxies_and_replicas_read_the_secret_from_the_instance_secret() -> None:
    user_env = {"env_vars": {"KUBESERVE_DATA_PLANE_SECRET": "mine", "MODE": "x"}}
    replica = main_container(workload(app_config(runtime_env=user_env)))
    proxy = render.render_proxy(instance(proxyLocation="HeadOnly"))[0]
    for container in (replica, main_container(proxy)):
        assert SECRET_REF in container["env"]  # a reference: the value is in no pod spec
        assert env(container)["KUBESERVE_DATA_PLANE_SECRET"] == SECRET_REF["valueFrom"]
    assert env(replica)["MODE"] == "x"  # the user's variable of that name is dropped, not others


def test_builds_and_init_containers_do_not_get_the_secret() -> None:
    config = app_config(runtime_env={"working_dir": "https://example.com/shop.zip"})
    job = render.render_build_job(instance(), app(config))
    replica = workload(config)
    for container in [*pod(job)["containers"], *pod(job)["initContainers"]]:
        assert "KUBESERVE_DATA_PLANE_SECRET" not in env(container)
    assert "KUBESERVE_DATA_PLANE_SECRET" not in env(pod(replica)["initContainers"][0])


def test_data_plane_secret_object() -> None:
    secret = render.render_data_plane_secret(instance(), "ab" * 32)
    assert secret["metadata"]["name"] == contract.dataplane_secret_name("default")
    assert secret["metadata"]["name"] == "default-dataplane-secret"
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert secret["data"] == {"secret": base64.b64encode(b"ab" * 32).decode()}
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("ServeInstance", "uid-inst")


# --------------------------------------------------------------------------- network policies


def matches(selector: Json, labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes label selector selects ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def admitted(policy: Json, port: int, peer: Mapping[str, str], peer_namespace: str) -> bool:
    """Whether ``policy`` lets a pod labelled ``peer`` in ``peer_namespace`` reach ``port``
    (the semantics of NetworkPolicy ingress rules, for the selectors kubeserve writes)."""
    namespace_labels = {"kubernetes.io/metadata.name": peer_namespace}
    for rule in policy["spec"]["ingress"]:
        if port not in [p["port"] for p in rule["ports"]]:
            continue
        if "from" not in rule:
            return True
        for source in rule["from"]:
            in_namespace = (
                matches(source["namespaceSelector"], namespace_labels)
                if "namespaceSelector" in source
                else peer_namespace == policy["metadata"]["namespace"]
            )
            if in_namespace and matches(source.get("podSelector", {}), peer):
                return True
    return False


def test_replica_port_admits_only_the_instances_pods_and_the_operator() -> None:
    inst = instance(proxyLocation="HeadOnly", httpOptions={"port": 8000})
    replicas, proxies, _ = render.render_instance_network_policies(inst, "kubeserve-system")
    replica_pod = pod(workload())
    replica_labels = workload()["spec"]["template"]["metadata"]["labels"]
    proxy_labels = render.render_proxy(inst)[0]["spec"]["template"]["metadata"]["labels"]
    assert matches(replicas["spec"]["podSelector"], replica_labels)
    assert not matches(replicas["spec"]["podSelector"], proxy_labels)
    assert matches(proxies["spec"]["podSelector"], proxy_labels)
    assert not matches(proxies["spec"]["podSelector"], replica_labels)
    assert replicas["spec"]["policyTypes"] == ["Ingress"]

    operator = {"app.kubernetes.io/part-of": "kubeserve", "app.kubernetes.io/component": "operator"}
    other_instance = {**replica_labels, "kubeserve.io/instance": "other"}
    build = render.render_build_job(inst, app())["spec"]["template"]["metadata"]["labels"]
    assert admitted(replicas, 8000, proxy_labels, "serving")
    assert admitted(replicas, 8000, replica_labels, "serving")  # handle calls
    assert admitted(replicas, 8000, operator, "kubeserve-system")  # user_config pushes
    assert not admitted(replicas, 8000, operator, "serving")  # an impostor elsewhere
    assert not admitted(replicas, 8000, other_instance, "serving")
    assert not admitted(replicas, 8000, build, "serving")
    assert not admitted(replicas, 8000, {"app": "curl"}, "serving")
    assert not admitted(replicas, 8000, proxy_labels, "elsewhere")
    # kubelet probes come from anywhere, to the probe port; Prometheus to the metrics port (its
    # token is checked there); nothing else
    assert admitted(replicas, 8081, {}, "anywhere")
    assert admitted(replicas, 8082, {}, "anywhere")
    assert not admitted(replicas, 9000, {}, "anywhere")
    ports = main_container(workload())["ports"]
    assert [(p["name"], p["containerPort"]) for p in ports] == [
        ("http", 8000),
        ("probe", 8081),
        ("metrics", 8082),
    ]
    assert replica_pod["containers"][0]["readinessProbe"]["httpGet"]["port"] == "probe"
    # the proxy port is open to everyone (the proxy refuses internal paths itself), and its
    # metrics port (behind the metrics token)
    assert admitted(proxies, 8000, {}, "anywhere")
    assert admitted(proxies, 8082, {}, "anywhere")


def test_no_proxy_policy_without_proxies() -> None:
    inst = instance(proxyLocation="Disabled")
    names = [p["metadata"]["name"] for p in render.render_instance_network_policies(inst, "ops")]
    assert names == ["default-replicas", "default-autoscaling-policies"]


def test_proxy_policy_follows_the_http_port() -> None:
    inst = instance(proxyLocation="EveryNode", httpOptions={"port": 9000})
    _, proxies, _ = render.render_instance_network_policies(inst, "ops")
    assert proxies["metadata"]["name"] == "default-proxies"
    ports = [{"port": 9000, "protocol": "TCP"}, {"port": 8082, "protocol": "TCP"}]
    assert proxies["spec"]["ingress"] == [{"ports": ports}]


def test_builder_args_and_route_prefix_reach_the_build_and_the_replicas() -> None:
    config = app_config(args={"message": "$(HOME) hi"}, route_prefix="/shop")
    container = main_container(render.render_build_job(instance(), app(config)))
    assert container["command"][-2:] == ["--args", '{"message": "$$(HOME) hi"}']
    replica_env = env(main_container(workload(config)))["KUBESERVE_REPLICA_CONFIG"]
    replica = json.loads(replica_env.replace("$(", "("))
    assert replica["app_args"] == {"message": "$$(HOME) hi".replace("$(", "(")}
    assert replica["route_prefix"] == "/shop"
    plain = json.loads(
        env(main_container(workload()))["KUBESERVE_REPLICA_CONFIG"].replace("$(", "(")
    )
    assert "app_args" not in plain and "route_prefix" not in plain


def test_proxy_and_replica_pods_tell_prometheus_where_their_metrics_are() -> None:
    """Scrape annotations, a ``metrics`` container port and the variable that turns it on; the
    token Secret holds only the derived token, never the data-plane secret."""
    inst = instance()
    proxy_workload = render.render_proxy(inst)[0]
    for template in (proxy_workload["spec"]["template"], workload()["spec"]["template"]):
        assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        assert template["metadata"]["annotations"]["prometheus.io/port"] == "8082"
        assert template["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
        main = template["spec"]["containers"][0]
        assert {"name": "metrics", "containerPort": 8082, "protocol": "TCP"} in main["ports"]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["KUBESERVE_METRICS_PORT"] == "8082"
    secret = render.render_metrics_token_secret(inst, "t0k3n")
    assert secret["metadata"]["name"] == "default-metrics-token"
    assert secret["data"] == {"token": base64.b64encode(b"t0k3n").decode()}
    assert secret["immutable"] is True


def test_the_top_level_logging_config_reaches_the_proxy_pods() -> None:
    """Ray's serve-config logging_config is the proxies': given to them as JSON, verbatim."""
    logging_config = {"encoding": "JSON", "logLevel": "DEBUG", "enableAccessLog": False}
    proxy = render.render_proxy(instance(loggingConfig=logging_config))[0]
    command = proxy["spec"]["template"]["spec"]["containers"][0]["command"]
    given = json.loads(command[command.index("--logging-config") + 1])
    assert (given["encoding"], given["log_level"], given["enable_access_log"]) == (
        "JSON",
        "DEBUG",
        False,
    )
    plain = render.render_proxy(instance())[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--logging-config" not in plain["command"]


# --------------------------------------------------------------------------- serve.run's graph


def test_an_imperative_application_mounts_its_graph_secret_in_build_and_replica_pods() -> None:
    view = app(IMPERATIVE)
    secret = contract.pickled_graph_secret_name("shop", "uid-app", "ab" * 32)
    assert view.graph_secret == secret
    job = render.render_build_job(instance(), view)
    replica = render.render_replica_workload(instance(), view, deployment(IMPERATIVE))
    for obj in (job, replica):
        volumes = {v["name"]: v for v in pod(obj)["volumes"]}
        assert volumes["pickled-graph"]["secret"] == {"secretName": secret, "defaultMode": 0o440}
        mounts = {m["name"]: m for m in main_container(obj)["volumeMounts"]}
        assert mounts["pickled-graph"] == {
            "name": "pickled-graph",
            "mountPath": contract.PICKLED_GRAPH_DIR,
            "readOnly": True,
        }
    command = main_container(job)["command"]
    assert command[2:4] == ["--pickled-file", render.PICKLED_GRAPH_FILE]
    assert render.PICKLED_GRAPH_FILE.startswith(contract.PICKLED_GRAPH_DIR + "/")
    variables = {"KUBESERVE_POD_NAME": "shop-model-abc"}
    replica_config = json.loads(
        expand(env(main_container(replica))["KUBESERVE_REPLICA_CONFIG"], variables)
    )
    assert replica_config["import_path"] == ""
    assert replica_config["app_graph_file"] == render.PICKLED_GRAPH_FILE


def test_a_new_graph_is_a_new_build_and_a_new_replica_version() -> None:
    other = {**IMPERATIVE, "pickled_graph_sha256": "cd" * 32}
    assert app(IMPERATIVE).build_key != app(other).build_key
    assert deployment(IMPERATIVE).version != deployment(other).version
    first = render.render_replica_workload(instance(), app(IMPERATIVE), deployment(IMPERATIVE))
    second = render.render_replica_workload(instance(), app(other), deployment(other))
    assert pod(first) != pod(second)


def test_a_declarative_application_mounts_no_graph() -> None:
    assert app().graph_secret is None
    for obj in (render.render_build_job(instance(), app()), workload()):
        assert "pickled-graph" not in {v["name"] for v in pod(obj)["volumes"]}


# --------------------------------------------------------------------------- policy host


def test_the_policy_host_runs_the_applications_code_behind_the_handshake() -> None:
    config = app_config(
        args={"size": 2},
        runtime_env={"working_dir": "https://example.com/shop.zip", "env_vars": {"A": "1"}},
    )
    obj = render.render_policy_workload(instance(), app(config))
    assert obj["kind"] == "Deployment"
    assert obj["metadata"]["name"] == "shop-autoscaling-policy"
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "ServeApplication"
    assert obj["spec"]["replicas"] == 1
    assert obj["spec"]["strategy"] == {"type": "Recreate"}
    spec = pod(obj)
    assert spec["automountServiceAccountToken"] is False
    main = main_container(obj)
    assert main["command"] == [
        "kubeserve",
        "policy-host",
        "shop",
        "--import-path",
        "shop.main:app",
        "--args",
        '{"size": 2}',
        "--host",
        "$(KUBESERVE_BIND_HOST)",
        "--port",
        "8000",
        "--identity",
        "$(KUBESERVE_POD_NAME)",
    ]
    env = {e["name"]: e for e in main["env"]}
    assert env["KUBESERVE_DATA_PLANE_SECRET"]["valueFrom"]["secretKeyRef"]["name"]
    assert env["A"]["value"] == "1"
    assert main["workingDir"].endswith("/working_dir")  # fetched like the replicas' files
    assert [c["name"] for c in spec["initContainers"]] == ["runtime-env"]
    labels = obj["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "autoscaling-policy"
    # who may connect: the operator only
    [policies] = [
        p
        for p in render.render_instance_network_policies(instance(), "ops")
        if p["metadata"]["name"] == "default-autoscaling-policies"
    ]
    operator = {"app.kubernetes.io/part-of": "kubeserve", "app.kubernetes.io/component": "operator"}
    assert matches(policies["spec"]["podSelector"], labels)
    assert admitted(policies, 8000, operator, "ops")
    replica_labels = workload()["spec"]["template"]["metadata"]["labels"]
    assert not admitted(policies, 8000, replica_labels, "serving")


def test_new_code_restarts_the_policy_host_and_an_imperative_one_reads_its_graph() -> None:
    before = render.render_policy_workload(instance(), app())
    after = render.render_policy_workload(instance(), app(app_config(import_path="shop.v2:app")))
    version = "kubeserve.io/replica-version"
    annotations = [o["spec"]["template"]["metadata"]["annotations"] for o in (before, after)]
    assert annotations[0][version] != annotations[1][version]
    imperative = render.render_policy_workload(instance(), app(IMPERATIVE))
    command = main_container(imperative)["command"]
    assert command[3:5] == ["--pickled-file", render.PICKLED_GRAPH_FILE]
    mounts = main_container(imperative)["volumeMounts"]
    assert any(m["mountPath"] == contract.PICKLED_GRAPH_DIR for m in mounts)


def test_tracing_config_reaches_the_proxy_and_replica_pods_only_when_it_enables_tracing() -> None:
    """As Ray's controller hands it to proxies and replicas: the proxy's command line and the
    replica's config, defaults filled; absent when tracing is off (nothing loads OpenTelemetry)."""
    traced = {"enabled": True, "exporterImportPath": "otel_setup:exporters"}
    wanted = {
        "enabled": True,
        "exporter_import_path": "otel_setup:exporters",
        "sampling_ratio": 0.01,
    }
    for spec, expected in [
        ({"tracingConfig": traced}, wanted),
        ({"tracingConfig": {"enabled": False, "samplingRatio": 1}}, None),
        ({}, None),
    ]:
        inst = instance(proxyLocation="HeadOnly", **spec)
        command = main_container(render.render_proxy(inst)[0])["command"]
        if expected is None:
            assert "--tracing-config" not in command
        else:
            given = command[command.index("--tracing-config") + 1]
            assert json.loads(expand(given, {})) == expected
        obj = render.render_replica_workload(inst, app(), deployment())
        raw = env(main_container(obj))["KUBESERVE_REPLICA_CONFIG"]
        replica = json.loads(expand(raw, {"KUBESERVE_POD_NAME": "shop-model-abc12"}))
        assert replica.get("tracing_config") == expected
        # the build checks the exporter where the application runs (a bad one: DEPLOY_FAILED)
        build = main_container(render.render_build_job(inst, app(inst=inst)))["command"]
        if expected is None:
            assert "--tracing-config" not in build
        else:
            given = build[build.index("--tracing-config") + 1]
            assert json.loads(expand(given, {})) == expected


def test_a_proxy_pod_runs_with_the_proxys_allocator_settings() -> None:
    """As ``kubeserve start``'s proxy: glibc's malloc thresholds fixed (``ALLOCATOR_ENV``), so a
    burst's buffers go back to the system."""
    proxy, _ = render.render_proxy(instance())
    found = env(main_container(proxy))
    assert found["MALLOC_MMAP_THRESHOLD_"] == "65536"
    assert found["MALLOC_TRIM_THRESHOLD_"] == "131072"
