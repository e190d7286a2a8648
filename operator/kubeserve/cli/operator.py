"""``kubeserve operator``: the Kubernetes operator with its admin API (the chart's Deployment).

Flags (and the environment variables the chart sets as their defaults) become one
:class:`~kubeserve.backends.kubernetes.operator.OperatorSettings`; the process itself is
:func:`kubeserve.backends.kubernetes.main.run_operator`.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import uuid
from collections.abc import Sequence

from kubeserve.cli.command import LOG_FORMAT, Command
from kubeserve.control.leader_election import LeaseTiming
from kubeserve.runtime.kubernetes.contract import NAMESPACE_ENV, POD_IP_ENV
from kubeserve.schema.config import DEFAULT_DATA_PATH, DataPath


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace",
        default=os.environ.get(NAMESPACE_ENV, "kubeserve-system"),
        help="the operator's own namespace (where the admin API writes custom resources)",
    )
    parser.add_argument(
        "--watch-namespaces",
        default=os.environ.get("KUBESERVE_WATCH_NAMESPACES", ""),
        help="comma-separated namespaces to watch; empty watches the whole cluster",
    )
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument(
        "--dashboard-host",
        default="0.0.0.0",
        help="address(es) of the admin server, comma-separated (default: all)",
    )
    parser.add_argument("--dashboard-port", type=int, default=8265)
    parser.add_argument(
        "--report-url",
        default=os.environ.get("KUBESERVE_REPORT_URL") or None,
        help="the admin server's URL as the instances' pods reach it (the chart sets the "
        "operator's Service): they report requests waiting for replicas there, which lets "
        "deployments scale to zero (default: $KUBESERVE_REPORT_URL; unset, min_replicas 0 is "
        "refused)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus /metrics here (0: off)"
    )
    parser.add_argument(
        "--leader-election-lease",
        default=os.environ.get("KUBESERVE_LEADER_ELECTION_LEASE", "kubeserve-operator"),
        help="the coordination.k8s.io Lease in --namespace on which the operator's replicas "
        "elect the one that reconciles (every replica serves the admin API); empty: no "
        "election, this process always reconciles",
    )
    for flag, default, meaning in (
        ("lease-duration", LeaseTiming.lease_duration_s, "how long another replica waits, after "
         "the Lease last changed, before it takes it"),
        ("renew-deadline", LeaseTiming.renew_deadline_s, "how long the leader keeps writing "
         "after its last successful renewal (then it pauses until the next; its term ends when "
         "none succeeded for the lease duration)"),
        ("retry-period", LeaseTiming.retry_period_s, "how often the leader renews the Lease and "
         "the other replicas try to take it"),
    ):  # fmt: skip
        parser.add_argument(
            f"--leader-election-{flag}",
            type=float,
            default=default,
            metavar="SECONDS",
            help=f"{meaning}; lease duration > renew deadline > retry period (default {default})",
        )
    parser.add_argument(
        "--advertise-url",
        default=os.environ.get("KUBESERVE_ADVERTISE_URL") or None,
        help="this replica's admin server as the other replicas reach it (they forward the "
        "pods' load reports to the leader); default http://$KUBESERVE_POD_IP:<dashboard port>, "
        "else the first --dashboard-host",
    )
    parser.add_argument(
        "--proxy-data-path",
        choices=[d.value for d in DataPath],
        default=DEFAULT_DATA_PATH.value,
        help="the proxies' data path for a ServeInstance whose spec.proxy.dataPath is unset "
        "(native: kubeserve-fastpath in front of the Python proxy, python in an image without "
        f"it; python: the Python proxy alone; default {DEFAULT_DATA_PATH.value})",
    )
    parser.add_argument(
        "--node-local-sockets",
        choices=["auto", "off"],
        default="auto",
        help="for a ServeInstance whose spec.proxy.nodeLocalSockets is unset: auto uses unix "
        "sockets in a directory of the node (a hostPath) between the pods of one node when a "
        "server-side dry run of such a pod is admitted in its namespace, TCP otherwise; off: "
        "TCP (default auto)",
    )
    parser.add_argument("--log-level", default=os.environ.get("KUBESERVE_LOG_LEVEL", "INFO"))


def run(args: argparse.Namespace) -> int:
    import uvloop
    from aiohttp import web
    from aiohttp.typedefs import Middleware

    from kubeserve.api.server import create_app
    from kubeserve.backends.kubernetes.backend import KubernetesBackend
    from kubeserve.backends.kubernetes.main import run_operator
    from kubeserve.backends.kubernetes.namespaces import WatchedNamespaces
    from kubeserve.backends.kubernetes.operator import ElectionSettings, OperatorSettings

    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it from there
    hosts = tuple(host.strip() for host in args.dashboard_host.split(","))
    try:
        timing = LeaseTiming(
            lease_duration_s=args.leader_election_lease_duration,
            renew_deadline_s=args.leader_election_renew_deadline,
            retry_period_s=args.leader_election_retry_period,
        )
    except ValueError as exc:
        raise SystemExit(f"kubeserve operator: --leader-election-*: {exc}") from None
    election = None
    if args.leader_election_lease:
        host = os.environ.get(POD_IP_ENV) or hosts[0]
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        election = ElectionSettings(
            identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
            advertise_url=args.advertise_url or f"http://{host}:{args.dashboard_port}",
            lease_name=args.leader_election_lease,
            timing=timing,
        )
    settings = OperatorSettings(
        namespace=args.namespace,
        watch_namespaces=tuple(n for n in args.watch_namespaces.split(",") if n),
        kubeconfig=args.kubeconfig,
        report_url=args.report_url,
        proxy_data_path=DataPath(args.proxy_data_path),
        node_sockets_auto=args.node_local_sockets == "auto",
        admin_hosts=hosts,
        admin_port=args.dashboard_port,
        metrics_port=args.metrics_port,
        election=election,
    )

    def admin_app(
        backend: KubernetesBackend,
        namespaces: WatchedNamespaces,
        middlewares: Sequence[Middleware],
    ) -> web.Application:
        return create_app(backend, namespaces=namespaces, middlewares=middlewares)

    return uvloop.run(run_operator(settings, admin_app))


COMMAND = Command("operator", "run the Kubernetes operator", add_arguments, run)
