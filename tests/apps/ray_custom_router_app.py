"""Custom request routers as Ray's documentation writes them ("Use Custom Algorithm for Request
Routing"): the routers and the deployments using them in one module. Each answer names the
replica that served it, so a test can see where the router sent each request.

- ``UniformRequestRouter`` and ``ThroughputAwareRequestRouter``: the docs' two examples.
- ``LowestIdRouter``: deterministic, every request to the replica with the lowest id.
- ``TopScoreRouter``: only replicas whose ``record_routing_stats`` reached the router, the one
  with the highest ``score`` first (``score_of`` its id); a request waits until stats arrived.
"""

import hashlib
import random
import time
from collections import defaultdict
from typing import Any, Dict, List, Optional

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import (
    FIFOMixin,
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)


class UniformRequestRouter(RequestRouter):
    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        print("UniformRequestRouter routing request")
        random.shuffle(candidate_replicas)
        return [candidate_replicas]

    def on_request_routed(
        self,
        pending_request: PendingRequest,
        replica_id: ReplicaID,
        result: ReplicaResult,
    ):
        print("on_request_routed callback is called!!")


class ThroughputAwareRequestRouter(FIFOMixin, MultiplexMixin, LocalityMixin, RequestRouter):
    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        top_ranked_replicas: Dict[ReplicaID, RunningReplica] = {}
        if pending_request is not None and pending_request.metadata.multiplexed_model_id:
            ranked_replicas_multiplex: List[RunningReplica] = (
                self.rank_replicas_via_multiplex(
                    replicas=candidate_replicas,
                    multiplexed_model_id=pending_request.metadata.multiplexed_model_id,
                )
            )[0]
            ranked_replicas_multiplex = self.select_available_replicas(
                candidates=ranked_replicas_multiplex
            )
            for replica in ranked_replicas_multiplex:
                top_ranked_replicas[replica.replica_id] = replica

        ranked_replicas_locality: List[RunningReplica] = self.rank_replicas_via_locality(
            replicas=candidate_replicas
        )[0]
        ranked_replicas_locality = self.select_available_replicas(
            candidates=ranked_replicas_locality
        )
        for replica in ranked_replicas_locality:
            top_ranked_replicas[replica.replica_id] = replica

        print("ThroughputAwareRequestRouter routing request")
        return [
            sorted(
                [replica for replica in top_ranked_replicas.values()],
                key=lambda r: r.routing_stats.get("throughput", 0),
            )
        ]


class LowestIdRouter(RequestRouter):
    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        return [[min(candidate_replicas, key=lambda r: r.replica_id.unique_id)]]


class TopScoreRouter(RequestRouter):
    def initialize_state(self, stat: str = "score"):
        self.stat = stat

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        reported = [r for r in candidate_replicas if self.stat in r.routing_stats]
        return [sorted(reported, key=lambda r: r.routing_stats[self.stat], reverse=True)]


class NotARouter:
    pass


def score_of(replica_tag: str) -> int:
    return int(hashlib.sha256(replica_tag.encode()).hexdigest()[:8], 16)


class _WhoAmI:
    def __init__(self):
        self.replica = serve.get_replica_context().replica_tag
        self.stats_polls = 0

    async def __call__(self, request: Any = None) -> Dict[str, Any]:
        return {"replica": self.replica, "stats_polls": self.stats_polls}

    def record_routing_stats(self) -> Dict[str, Any]:
        self.stats_polls += 1
        return {"score": score_of(self.replica)}


@serve.deployment(num_replicas=3)
class Spread(_WhoAmI):
    """No custom router: kubeserve's power of two choices."""


@serve.deployment(
    num_replicas=3,
    request_router_config=RequestRouterConfig(
        request_router_class="ray_custom_router_app:LowestIdRouter"
    ),
)
class Lowest(_WhoAmI):
    pass


@serve.deployment(
    num_replicas=3,
    request_router_config=RequestRouterConfig(
        request_router_class="ray_custom_router_app:TopScoreRouter",
        request_router_kwargs={"stat": "score"},
        request_routing_stats_period_s=0.5,
        request_routing_stats_timeout_s=2,
    ),
)
class Scored(_WhoAmI):
    pass


@serve.deployment(
    request_router_config=RequestRouterConfig(
        request_router_class="ray_custom_router_app:UniformRequestRouter"
    ),
    num_replicas=3,
)
class UniformRequestRouterApp(_WhoAmI):
    pass


def _time_ms() -> int:
    return int(time.time() * 1000)


@serve.deployment(
    request_router_config=RequestRouterConfig(
        request_router_class="ray_custom_router_app:ThroughputAwareRequestRouter",
        request_routing_stats_period_s=1,
        request_routing_stats_timeout_s=1,
    ),
    num_replicas=3,
)
class ThroughputAwareRequestRouterApp:
    def __init__(self):
        self.throughput_buckets: Dict[int, int] = defaultdict(int)
        self.last_throughput_buckets = _time_ms()
        self.replica = serve.get_replica_context().replica_tag

    def __call__(self, request: Any = None) -> Dict[str, Any]:
        self.update_throughput()
        return {"replica": self.replica}

    def update_throughput(self):
        current_timestamp_ms = _time_ms()
        if current_timestamp_ms < self.last_throughput_buckets - 1000:
            return
        self.throughput_buckets[current_timestamp_ms] += 1
        self.last_throughput_buckets = current_timestamp_ms

    def record_routing_stats(self) -> Dict[str, Any]:
        current_timestamp_ms = _time_ms()
        throughput = 0
        for t in range(current_timestamp_ms - 1000, current_timestamp_ms):
            throughput += self.throughput_buckets[t]
        return {"throughput": throughput}


@serve.deployment
class Caller:
    """``GET ?n=30``: n calls through a handle to ``Lowest`` (routed in this replica)."""

    def __init__(self, target: DeploymentHandle):
        self.target = target

    async def __call__(self, request) -> List[Dict[str, Any]]:
        n = int(request.query_params["n"])
        return [await self.target.remote() for _ in range(n)]


spread_app = Spread.bind()
lowest_app = Lowest.bind()
scored_app = Scored.bind()
uniform_app = UniformRequestRouterApp.bind()
throughput_app = ThroughputAwareRequestRouterApp.bind()
caller_app = Caller.bind(Lowest.bind())
