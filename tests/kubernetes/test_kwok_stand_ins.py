"""Lists and watches at the scale of a thousand applications, on the kwok cluster's real API
server: the client's paginated list (one snapshot in pages, where 6,000 pods in one answer
outlasted the request timeout) and the pod stand-ins' watches, which resume where they ended
instead of listing every pod of the cluster again."""

from __future__ import annotations

import asyncio
import time

from kubeserve.runtime.kubernetes.client import Kube
from support.kwok_cluster import KwokCluster
from support.kwok_pods import PodStandIns

LABEL = "kubeserve.io/test-page"


def test_a_list_in_pages_is_the_whole_list_and_a_watch_resumes_from_it(
    kwok: KwokCluster, kwok_namespace: str
) -> None:
    async def scenario() -> None:
        kube = await Kube.connect(str(kwok.kubeconfig))
        try:
            for i in range(7):
                body = {"metadata": {"name": f"page-{i}", "labels": {LABEL: "yes"}}}
                await kube.create("ConfigMap", kwok_namespace, body)
            whole, _ = await kube.list_with_version("ConfigMap", kwok_namespace, f"{LABEL}=yes")
            sent = kube.requests
            paged, version = await kube.list_with_version(
                "ConfigMap", kwok_namespace, f"{LABEL}=yes", page_size=3
            )
            assert kube.requests - sent == 3  # 3 + 3 + 1
            assert [c["metadata"]["name"] for c in paged] == [c["metadata"]["name"] for c in whole]
            assert len(paged) == 7 and version
            # the pages' version is the snapshot's: a watch from it sees what came after, only
            late = {"metadata": {"name": "page-late", "labels": {LABEL: "yes"}}}
            await kube.create("ConfigMap", kwok_namespace, late)
            events = kube.watch("ConfigMap", kwok_namespace, f"{LABEL}=yes", version, 5)
            seen = [(e.type, e.object["metadata"].get("name")) async for e in events]
            assert ("ADDED", "page-late") in seen
            assert [s for s in seen if s[0] != "BOOKMARK"] == [("ADDED", "page-late")]
        finally:
            await kube.close()

    asyncio.run(scenario())


def test_the_stand_ins_resume_their_watches_without_listing_again(kwok: KwokCluster) -> None:
    """Watches the API server ends every second: each resumes at the version it reached, and
    the pods and Jobs of the cluster are listed once."""
    with PodStandIns(kwok.kubeconfig, watch_timeout_s=1) as stand_ins:
        deadline = time.monotonic() + 30
        while stand_ins.lists != {"Job": 1, "Pod": 1} and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # five watches or more of each kind ended meanwhile
        # (the objects of other tests' namespaces, terminating, may fail to be stood in for)
        failed = [e for e in stand_ins.errors if e.startswith(("Job ", "Pod "))]
        assert stand_ins.lists == {"Job": 1, "Pod": 1}, failed
        assert failed == []  # no list, no watch failed
