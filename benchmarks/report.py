"""``results.md`` from the bench's ``results.json``: the tables and the issue's targets, checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import load

# Which Ray setup a kubeserve setup is compared with (direct has no Ray twin: Ray's replicas have
# no HTTP port of their own, so it is compared with Ray's proxy path).
_RAY_TWIN = {
    "no-op, direct to replica": "no-op via proxy, 1 replica",
    "no-op via proxy, 1 replica": "no-op via proxy, 1 replica",
    "no-op via proxy, 2 replicas": "no-op via proxy, 2 replicas",
    "composed (ingress -> handle)": "composed (ingress -> handle)",
}
_DIRECT = "no-op, direct to replica"
_ONE = "no-op via proxy, 1 replica"
# The reference proxy (benchmarks/nginx.py), measured in turns with direct and the kubeserve proxy.
NGINX_SYSTEM = "nginx (reference)"
NGINX_SETUP = "no-op via nginx, 1 replica"

# The no-op app on real pods of the kubernetes tier's node, written by kubernetes_row.py.
KUBERNETES_SYSTEM = "kubeserve on Kubernetes (real node)"
KUBERNETES_RESULTS = Path(__file__).resolve().parent / "results-kubernetes.json"
# The reference: the embedded proxy (`kubeserve start`) on the same machine, in cgroups weighted
# like the pods; wrk runs in a pod of the node for the others.
K8S_EMBEDDED = "no-op via embedded proxy on the host, 1 replica"
K8S_PROXY = "no-op via proxy pod, 1 replica"
K8S_SERVICE = "no-op via proxy Service ClusterIP"
# The first two leave spec.proxy.nodeLocalSockets unset (the operator's Auto: the node's socket
# to the replica, as the namespace admits it); this one, in its own namespace with the same app,
# sets it false (TCP to the replica across the bridge).
K8S_TCP = "no-op via proxy pod, TCP to the replica (nodeLocalSockets: false), 1 replica"
_K8S_RAY_TWIN = {
    K8S_EMBEDDED: "no-op via proxy, 1 replica",
    K8S_PROXY: "no-op via proxy, 1 replica",
    K8S_SERVICE: "no-op via proxy, 1 replica",
    K8S_TCP: "no-op via proxy, 1 replica",
}
#: The proxy pod's share of the embedded proxy's req/s that the issue asks for.
K8S_TARGET = 0.9

# The operator with 1,000 applications on kwok's fake nodes, written by operator_scale.py.
OPERATOR_SCALE_RESULTS = Path(__file__).resolve().parent / "results-operator-scale.json"


#: The committed baseline ``make bench`` compares with (``make bench-baseline`` rewrites it).
BASELINE = Path(__file__).resolve().parent / "baseline.json"
#: CPU per request above the baseline by more than this share is flagged.
CPU_TOLERANCE = 0.10


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _kubernetes(results: dict[str, Any]) -> dict[str, Any] | None:
    """The cluster figures: in ``results`` when given, else ``results-kubernetes.json``."""
    if results.get("kubernetes"):
        return dict(results["kubernetes"])
    if KUBERNETES_RESULTS.exists():
        return dict(json.loads(KUBERNETES_RESULTS.read_text()))
    return None


def _loads(results: dict[str, Any], system: str) -> dict[str, dict[str, Any]]:
    figures = results["systems"].get(system)
    return {} if figures is None else {r["setup"]: r for r in figures["loads"]}


def _median_run(entry: dict[str, Any]) -> dict[str, Any]:
    runs = sorted(entry["runs"], key=lambda r: r["requests_per_s"])
    return dict(runs[len(runs) // 2])


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.1f}x" if a / b >= 10 else f"{a / b:.2f}x"


def load_table(results: dict[str, Any]) -> list[str]:
    ks, ray = _loads(results, "kubeserve"), _loads(results, "ray")
    direct = ks.get(_DIRECT, {}).get("requests_per_s")
    lines = [
        "| system | setup | conns | req/s (median of 3) | CPU us/req, front | CPU us/req, all | "
        "p50 ms | p99 ms | errors | vs Ray | vs direct | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system, table in (("kubeserve", ks), ("Ray Serve 2.60", ray)):
        for setup, entry in table.items():
            run = _median_run(entry)
            twin = ray.get(_RAY_TWIN.get(setup, ""), {}).get("requests_per_s")
            vs_ray = _ratio(entry["requests_per_s"], twin) if system == "kubeserve" else "1x"
            on_kubeserve = system == "kubeserve" and "no-op" in setup
            vs_direct = _percent(entry["requests_per_s"], direct) if on_kubeserve else "-"
            errors = sum(r["errors"] for r in entry["runs"])
            label = NGINX_SYSTEM if setup == NGINX_SETUP else system
            lines.append(
                f"| {label} | {setup} | {entry['connections']} | {entry['requests_per_s']:,.0f} | "
                f"{_cpu(entry.get('cpu_us'))} | {_cpu(entry.get('cpu_all_us'))} | "
                f"{run['p50_ms']:.2f} | {run['p99_ms']:.2f} | {errors} | {vs_ray} | {vs_direct} | "
                f"{_load(entry)} |"
            )
    k8s = _kubernetes(results)
    k8s_loads = {r["setup"]: r for r in k8s["loads"]} if k8s else {}
    k8s_direct = k8s_loads.get(K8S_EMBEDDED, {}).get("requests_per_s")
    for setup, entry in k8s_loads.items():
        run = _median_run(entry)
        twin = ray.get(_K8S_RAY_TWIN.get(setup, ""), {}).get("requests_per_s")
        errors = sum(r["errors"] for r in entry["runs"])
        lines.append(
            f"| {KUBERNETES_SYSTEM} | {setup} | {entry['connections']} | "
            f"{entry['requests_per_s']:,.0f} | {_cpu(entry.get('cpu_us'))} | "
            f"{_cpu(entry.get('cpu_all_us'))} | {run['p50_ms']:.2f} | {run['p99_ms']:.2f} | "
            f"{errors} | {_ratio(entry['requests_per_s'], twin)} | "
            f"{_percent(entry['requests_per_s'], k8s_direct)} | {_load(entry)} |"
        )
    return lines


def baseline_rows(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """This run's kubeserve (and nginx) rows as a baseline: median req/s and CPU per request."""
    return {
        setup: {
            "requests_per_s": entry["requests_per_s"],
            "cpu_us": entry.get("cpu_us"),
            "cpu_all_us": entry.get("cpu_all_us"),
        }
        for setup, entry in _loads(results, "kubeserve").items()
    }


def baseline_table(results: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """This run against the committed baseline: the guard that keeps the data plane's speed.

    CPU per request is the figure compared (req/s follows the machine's background load); a row
    whose CPU per request of the front process grew by more than :data:`CPU_TOLERANCE` is
    flagged ``MORE CPU``."""
    if not baseline:
        return ["No baseline committed (`make bench-baseline` writes `benchmarks/baseline.json`)."]
    rows = baseline.get("rows", {})
    lines = [
        f"Baseline: `benchmarks/baseline.json`, measured {baseline.get('date', '?')} at commit "
        f"{baseline.get('commit', '?')} (load average {baseline.get('load', '?')}).",
        "",
        "| setup | req/s now / baseline | CPU us/req front, now / baseline | "
        "CPU us/req all, now / baseline | verdict |",
        "|---|---|---|---|---|",
    ]
    for setup, now in baseline_rows(results).items():
        then = rows.get(setup)
        if then is None:
            lines.append(f"| {setup} | new row | {_cpu(now['cpu_us'])} | - | - |")
            continue
        front, front_then = now["cpu_us"], then.get("cpu_us")
        verdict = "-"
        if front is not None and front_then:
            verdict = "MORE CPU" if front > front_then * (1 + CPU_TOLERANCE) else "ok"
        lines.append(
            f"| {setup} | {now['requests_per_s']:,.0f} / {then['requests_per_s']:,.0f} "
            f"({_percent(now['requests_per_s'], then['requests_per_s'])}) | "
            f"{_cpu(front)} / {_cpu(front_then)} ({_percent(front, front_then)}) | "
            f"{_cpu(now['cpu_all_us'])} / {_cpu(then.get('cpu_all_us'))} "
            f"({_percent(now['cpu_all_us'], then.get('cpu_all_us'))}) | {verdict} |"
        )
    return lines


def nginx_note(results: dict[str, Any]) -> list[str]:
    """What the nginx row is, and the kubeserve proxy against it."""
    ks = _loads(results, "kubeserve")
    if NGINX_SETUP not in ks:
        return []
    rps = {k: v["requests_per_s"] for k, v in ks.items()}
    return [
        "",
        f"The `{NGINX_SYSTEM}` row is {results['machine'].get('nginx') or 'nginx'} in front of "
        "the same no-op replica code (`benchmarks/nginx.py`: 1 worker process, keep-alive "
        "upstream connections, access log off): the issue's own example of a "
        "proxy working at the protocol level. The direct, kubeserve-proxy and nginx rows are "
        "measured in turns (run 1 of each, then run 2 of each, ...), so their ratios compare "
        "runs under the same background load. Through one proxy process, the proxy, the replica "
        "and wrk share 2 cores, so the hop costs a share that grows with the replica's speed. "
        f"The kubeserve proxy reaches {_percent(rps.get(_ONE), rps.get(NGINX_SETUP))} of "
        "nginx's req/s here.",
    ]


def turn_shares(entry: dict[str, Any], reference: dict[str, Any]) -> list[float]:
    """``entry``'s req/s over ``reference``'s, run by run (the two ran in turns: run i of one
    right after run i of the other, so each pair shared the machine's background)."""
    return [
        mine["requests_per_s"] / theirs["requests_per_s"]
        for mine, theirs in zip(entry.get("runs", []), reference.get("runs", []), strict=False)
        if theirs.get("requests_per_s")
    ]


def kubernetes_note(results: dict[str, Any]) -> list[str]:
    """What the cluster rows are and how they were loaded; the proxy pod against the embedded
    proxy of the same run."""
    k8s = _kubernetes(results)
    if not k8s:
        return []
    loads = {r["setup"]: r for r in k8s["loads"]}
    m = k8s["machine"]
    lines = [
        "",
        f"The `{KUBERNETES_SYSTEM}` rows were measured by `make bench-kubernetes` "
        f"(`benchmarks/kubernetes_row.py`) on {m['date']} ({m['cpus']} CPUs, load average "
        f"{' '.join(m['load_before'])} before, {' '.join(m.get('load_after', ['?']))} after), "
        "with the same wrk settings, in turns: the real single-node cluster of the kubernetes "
        f"tier (etcd, kube-apiserver {k8s.get('kube_apiserver', '?')}, controller manager, "
        "scheduler, kubelet with containerd, kube-proxy, CoreDNS) and `kubeserve operator` run "
        "on the same 2 cores; a ServeInstance (HeadOnly proxy) and a ServeApplication of the "
        "same no-op deployment (`benchmarks/apps.py`, 1 replica, `maxOngoingRequests: 100`, "
        "`numCpus: 0.5`) in "
        "pods of the kubeserve image. wrk runs in a pod of the node (Debian's wrk, CPU requests "
        "of the proxy pod, so the same cgroup weight) and loads the proxy pod's address (port "
        "8000, `/noop`) and the proxy Service's ClusterIP (kube-proxy's rules in front of the "
        "same pod); that ServeInstance leaves `spec.proxy.nodeLocalSockets` unset, so the "
        "operator's default (Auto: its namespace admits the pods) has the proxy reach the "
        "replica through a unix socket in the node's directory. The TCP row is the same app on "
        "a second ServeInstance with `spec.proxy.nodeLocalSockets: false` (its own namespace, "
        "proxy, replica and wrk pods): TCP to the replica across the bridge. The reference "
        "row is `kubeserve start` on the host with the same "
        "app, its proxy, its replica and wrk each moved into a cgroup weighted like the proxy, "
        "replica and wrk pods, under a parent weighted like the node's cgroup root: both setups "
        "compete with the rest of the machine on the same terms, so the ratio is about the "
        "path, not cgroup weights. `vs direct` on these rows is against that reference; "
        "`CPU us/req, front` is the proxy process (found in /proc by its pod's cgroup), `all` "
        "adds the replica and, on pods, the two pods' containerd shims (which carry the lines "
        "the pods write to stderr into the node's log files; `kubeserve start` writes its own "
        "log files).",
    ]
    pods = k8s.get("pods")
    if pods:
        lines += ["", "| pod | requests | limits | cpu.shares | CFS quota | throttled periods |"]
        lines.append("|---|---|---|---|---|---|")
        for role, pod in pods.items():
            quota = "none" if pod["cfs_quota_us"] < 0 else f"{pod['cfs_quota_us']} us"
            res = pod["resources"]
            lines.append(
                f"| {role} | {_resource_text(res.get('requests'))} | "
                f"{_resource_text(res.get('limits'))} | {pod['cpu_shares']} | {quota} | "
                f"{pod['throttled_periods']} ({pod['throttled_ms']} ms) |"
            )
    interpreters = k8s.get("interpreters")
    if interpreters:
        lines += [
            "",
            "Python (version; OPT; the event loop and HTTP parser): "
            + ", ".join(f"{where}: {found}" for where, found in interpreters.items())
            + ".",
        ]
    reference = loads.get(K8S_EMBEDDED)
    for setup in (K8S_PROXY, K8S_SERVICE, K8S_TCP):
        entry = loads.get(setup)
        if not entry or not reference:
            continue
        share = entry["requests_per_s"] / reference["requests_per_s"]
        verdict = "meets" if share >= K8S_TARGET else "misses"
        turns = ", ".join(f"{t:.0%}" for t in turn_shares(entry, reference))
        lines += [
            "",
            f"`{setup}` reaches {share:.1%} of the embedded proxy's req/s in the same run "
            f"({verdict} the target of {K8S_TARGET:.0%}; turn by turn {turns}). "
            "CPU per request of the proxy process: "
            f"{_cpu(entry.get('cpu_us'))} us in the pod ({_cpu(entry.get('cpu_system_us'))} "
            f"of it system time), {_cpu(reference.get('cpu_us'))} us embedded "
            f"({_cpu(reference.get('cpu_system_us'))} system); proxy, replica and, on pods, "
            f"their runtime shims: {_cpu(entry.get('cpu_all_us'))} us against "
            f"{_cpu(reference.get('cpu_all_us'))}; the whole machine (wrk, the container "
            f"runtime, the kernel's interrupts too): {_cpu(entry.get('machine_us'))} us against "
            f"{_cpu(reference.get('machine_us'))}.{_each_text(entry, reference)}",
        ]
    return lines


def _each_text(entry: dict[str, Any], reference: dict[str, Any]) -> str:
    """Per process, its CPU us per request on pods against embedded (where both were read)."""
    parts = []
    for where in (entry, reference):
        each, names = where.get("cpu_each_us"), where.get("processes")
        if not each or not names:
            return ""
        totals: dict[str, float] = {}
        for name, used in zip(names, each, strict=True):
            totals[name] = totals.get(name, 0.0) + used
        parts.append(", ".join(f"{name} {_cpu(used)}" for name, used in totals.items()))
    return f" Per process, on pods: {parts[0]}; embedded: {parts[1]}."


def _resource_text(values: dict[str, str] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (values or {}).items()) or "none"


def _load(entry: dict[str, Any]) -> str:
    before, after = entry.get("load_average", (0.0, 0.0))
    return f"{before:.1f} -> {after:.1f}"


def _percent(a: float | None, b: float | None) -> str:
    return f"{a / b:.0%}" if a and b else "-"


def control_table(results: dict[str, Any]) -> list[str]:
    systems = results["systems"]
    ks = systems.get("kubeserve", {}).get("control_plane")
    ray = systems.get("ray", {}).get("control_plane")
    names = list((ks or ray)["medians"]) if (ks or ray) else []
    lines = [
        "| step | kubeserve (median s) | Ray Serve 2.60 (median s) | Ray / kubeserve | "
        "kubeserve runs | Ray runs |",
        "|---|---|---|---|---|---|",
    ]
    keys = ["deploy_s", "first_answer_s", "user_config_s", "scale_s", "driver_s"]
    for name, key in zip(names, keys[: len(names)], strict=True):  # older results: fewer steps
        a = ks["medians"][name] if ks else None
        b = ray["medians"][name] if ray else None
        runs_a = ", ".join(f"{x:.3f}" for x in ks[key]) if ks else "-"
        runs_b = ", ".join(f"{x:.3f}" for x in ray[key]) if ray else "-"
        lines.append(f"| {name} | {_fmt(a)} | {_fmt(b)} | {_ratio(b, a)} | {runs_a} | {runs_b} |")
    return lines


def memory_table(results: dict[str, Any]) -> list[str]:
    ks = results["systems"].get("kubeserve", {}).get("rss_mb", {})
    ray = results["systems"].get("ray", {}).get("rss_mb", {})
    lines = ["| process | kubeserve RSS (MB) | Ray Serve 2.60 RSS (MB) |", "|---|---|---|"]
    for role in ks or ray:
        lines.append(f"| {role} | {_fmt(ks.get(role), 1)} | {_fmt(ray.get(role), 1)} |")
    return lines


def targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each with the measured figure and whether it is met."""
    ks, ray = _loads(results, "kubeserve"), _loads(results, "ray")
    if not ks:
        return []
    rps = {k: v["requests_per_s"] for k, v in ks.items()}
    ray_rps = {k: v["requests_per_s"] for k, v in ray.items()}
    one = "no-op via proxy, 1 replica"
    composed = "composed (ingress -> handle)"
    cp = results["systems"]["kubeserve"]["control_plane"]["medians"]
    ray_cp = results["systems"].get("ray", {}).get("control_plane", {}).get("medians", {})
    mem = results["systems"]["kubeserve"]["rss_mb"]
    checks: list[tuple[str, str, bool | None]] = []

    def ratio_check(label: str, a: float | None, b: float | None, need: float) -> None:
        if a and b:
            checks.append((label, f"{a / b:.1f}x", a / b >= need))
        else:
            checks.append((label, "-", None))

    ratio_check("proxy, 1 replica: >= 20x Ray's req/s", rps.get(one), ray_rps.get(one), 20)
    p99 = _median_run(ks[one])["p99_ms"] if one in ks else None
    checks.append(
        ("proxy, 1 replica: p99 < 5 ms", _fmt(p99, 2) + " ms", p99 is not None and p99 < 5)
    )
    a, b = rps.get(one), rps.get(_DIRECT)
    reference = rps.get(NGINX_SETUP)
    measured = _percent(a, b) + (
        f" (nginx, same runs: {_percent(reference, b)})" if reference else ""
    )
    checks.append(("proxy, 1 replica: >= 70% of direct", measured, bool(a and b and a / b >= 0.7)))
    ratio_check("composed: >= 30x Ray's req/s", rps.get(composed), ray_rps.get(composed), 30)
    deploy = "PUT -> RUNNING (composed)"
    ratio_check("PUT -> RUNNING >= 3x faster than Ray", ray_cp.get(deploy), cp.get(deploy), 3)
    uc = cp["user_config change -> applied"]
    checks.append(("user_config -> applied < 0.2 s", f"{uc:.3f} s", uc < 0.2))
    for role in ("proxy", "replica (no-op)", "replica (composed ingress)"):
        checks.append((f"{role} RSS < 60 MB", f"{mem[role]:.1f} MB", mem[role] < 60))
    lines = ["| target | measured | met |", "|---|---|---|"]
    for label, value, ok in checks:
        lines.append(f"| {label} | {value} | {'-' if ok is None else ('yes' if ok else 'NO')} |")
    return lines


def operator_scale_section(path: Path = OPERATOR_SCALE_RESULTS) -> list[str]:
    """``## Operator at scale``: the figures of ``make bench-operator-scale`` and its targets."""
    if not path.exists():
        return []
    r = json.loads(path.read_text())
    idle, churn, one = r["idle"], r["churn"], r["one_change_s"]
    m = r["machine"]

    def target(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines = [
        "## Operator at scale (kwok)",
        "",
        f"`make bench-operator-scale` on {m['date']} ({m['cpus']} CPUs, load average "
        f"{', '.join(map(str, m['load_before']))} before, {', '.join(map(str, m['load_after']))} "
        f"after): {r['apps']:,} ServeApplications of 3 deployments ({r['pods']:,} replica pods) "
        f"on {r['nodes']} fake nodes of kwok, against the real kube-apiserver, controllers and "
        "scheduler on the same 2 cores; the operator's requests from the API server's audit log "
        "(`benchmarks/operator_scale.py` says how). The operator ran "
        + ("with" if r.get("leader_election", True) else "**without**")
        + " leader election.",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| apply of all -> all Ready | {r['all_ready_s']:.0f} s (the creates themselves "
        f"{r['apply_s']:.0f} s; operator CPU {r['cpu_s_to_ready']:.0f} s) | 300 s: "
        f"{target(r['all_ready_s'] <= 300)} |",
        f"| one app's change -> Ready, {r['apps'] - 1:,} others idle | {one['median']:.2f} s "
        f"(median of "
        f"{', '.join(map(str, one['samples']))}) | 5 s: {target(one['median'] <= 5)} |",
        f"| API writes / min, idle | {idle['writes_per_min_besides_election']:g} (plus "
        f"{idle['writes_per_min'] - idle['writes_per_min_besides_election']:g} renewals of the "
        f"leader's Lease) | 0: {target(idle['writes_per_min_besides_election'] == 0)} |",
        f"| API requests / min, idle | {idle['requests_per_min']:g} | |",
        f"| operator CPU, idle | {idle['cpu_percent']:g}% of a core | |",
    ]
    settle = r.get("settle_after_ready")
    if settle:
        lines.append(
            f"| cluster writes after all Ready (controllers catching up) | {settle['s']:g} s "
            f"(controller-manager {settle['cores'].get('kube-controller-manager', 0):g} cores; "
            f"idle then {idle.get('cores', {}).get('kube-controller-manager', 0):g}) | |"
        )
    lines += [
        f"| operator RSS | {r['rss_mib_ready']:.0f} MiB all Ready, {r['rss_mib_peak']:.0f} MiB "
        f"peak | 500 MB: {target(r['rss_mib_peak'] * 1.048576 < 500)} |",
        f"| churn of {churn['apps']} apps -> all Ready | {churn['all_ready_s']:.0f} s | |",
        f"| API requests / min, churn | {churn['requests_per_min']:g} "
        f"({churn['writes_per_min']:g} writes) | |",
        f"| operator CPU, churn | {churn['cpu_percent']:g}% of a core | |",
        *_writes_per_app_rows(r),
        "",
        "Requests per minute by verb and resource, idle: "
        + (", ".join(f"{k} {v:g}" for k, v in idle["by_kind_per_min"].items()) or "none")
        + ". During the churn: "
        + ", ".join(f"{k} {v:g}" for k, v in list(churn["by_kind_per_min"].items())[:12])
        + ".",
        "",
    ]
    return lines


def _writes_per_app_rows(r: dict[str, Any]) -> list[str]:
    """The operator's writes per application, rolling out and changed (runs that counted them)."""
    rows = []
    for label, counts in (
        ("roll-out", r.get("rollout_writes_per_app")),
        ("change (churn)", r["churn"].get("writes_per_app")),
    ):
        if counts:
            each = ", ".join(f"{k} {v:g}" for k, v in counts.items())
            rows.append(f"| API writes per app, {label} | {sum(counts.values()):.1f} ({each}) | |")
    return rows


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    ks_loads = _loads(results, "kubeserve")
    spread = [
        setup + ": " + ", ".join(f"{r['requests_per_s']:,.0f}" for r in entry["runs"])
        for setup, entry in ks_loads.items()
    ]
    out = [
        "# kubeserve vs Ray Serve 2.60: data plane and control plane",
        "",
        f"Measured by `make bench` on {m['date']}: {m['cpus']} CPUs ({m['cpu']}), "
        f"{m['memory_gb']} GB RAM, Linux {m['kernel']}, Python {m['python']}, {m['wrk']}.",
        f"Load average before the run: {' '.join(m['load_before'])}; after: "
        f"{' '.join(m.get('load_after', ['?']))}.",
        "",
        "The machine is small (2 cores) and shared with other work (test suites of other "
        "engineers may run at the same time), so figures move by several percent between runs; "
        "run it when the machine is as quiet as it gets (the load averages above and in the table "
        "say how quiet it was). wrk, the serving system under test and "
        "its replicas all share the same 2 cores, so the load generator takes CPU away from the "
        "system it measures (equally for both systems). One system runs at a time. The `load avg` "
        "column is the machine's 1-minute load average before and after a setup's runs: above "
        "~3 (wrk + proxy + replica), something else was competing for the 2 cores.",
        "",
        f"wrk: {load.THREADS} thread, {load.CONNECTIONS} connections, {load.DURATION_S} s runs, "
        f"{load.RUNS} runs per setup after a {load.WARMUP_S} s warm-up; the table shows the "
        "median req/s of the runs and the p50/p99 of the median run. The no-op replica answers "
        "`ok` (`benchmarks/apps.py`, `benchmarks/ray_apps.py`, `max_ongoing_requests=100` on "
        "both); the composed app is `examples/composed.py` (an ingress calling a Greeter through "
        "a DeploymentHandle, default `max_ongoing_requests`) and its Ray twin in "
        "`benchmarks/ray_apps.py`.",
        "",
        "Ray runs from its own virtualenv (`make ray-client`), started by the bench with "
        "`ray start --head` on 127.0.0.1 (2 CPUs, 100 MB object store) and stopped with "
        "`ray stop --force`; its deployments ask for 0.25 CPU each so that 2 no-op replicas, the "
        "composed app and 4 Greeters fit on the 2-CPU node. kubeserve runs from `.venv` "
        "(`kubeserve start` on free ports). The plot (`results.png`) is drawn with matplotlib "
        "from a bench-only virtualenv (`~/.cache/kubeserve/bench`).",
        "",
        "## Requests",
        "",
        *load_table(results),
        *nginx_note(results),
        *kubernetes_note(results),
        "",
        "`CPU us/req` is the CPU time (user + system, from /proc) the processes used during a "
        "run divided by the requests served: `front` is the process wrk talks to (the proxy, "
        "nginx's worker, or the replica on the direct row), `all` adds every replica of the "
        "application (and, for nginx, the plain replica behind it). Unlike req/s it does not "
        "follow a neighbour's load, though heavy contention for the 2 cores inflates it too.",
        "",
        "## Against the baseline",
        "",
        *baseline_table(results, results.get("baseline")),
        "",
        "## Control plane",
        "",
        *control_table(results),
        "",
        "## Memory (RSS after the load runs)",
        "",
        *memory_table(results),
        "",
        "## Targets",
        "",
        *targets(results),
        "",
        *operator_scale_section(),
        "## Spread (req/s of every kubeserve run)",
        "",
        *[f"- {line}" for line in spread],
        "",
    ]
    return "\n".join(out)
