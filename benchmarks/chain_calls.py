"""The chain in one process: the chain's ingress (replica_stages' harness: sealed frames in,
answers counted) calling a real Leaf replica server over a real sealed socket through a real
HandleClient. Prints CPU us per request (best of rounds) and Python calls per request
(sys.setprofile 'call' events, C calls separately).

    TREE/.venv/bin/python benchmarks/chain_calls.py TREE [requests] [rounds]
"""

import asyncio
import os
import sys
from collections import Counter

TREE = os.path.abspath(sys.argv[1])
N = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
os.environ["KUBESERVE_TREE"] = TREE
sys.path[:0] = [TREE, TREE + "/operator", TREE + "/benchmarks", TREE + "/tests"]
os.chdir(TREE)

import stages  # noqa: E402

stages._APPS["Chain"] = "chain"
import replica_stages  # noqa: E402

SECRET = b"test-secret-0123456789abcdef0123"


async def main() -> None:
    from kubeserve.runtime.channel import Role
    from kubeserve.runtime.handle_client import HandleClient
    from kubeserve.runtime.replica.control import Control
    from kubeserve.runtime.replica.http import ReplicaHttpServer
    from kubeserve.runtime.replica.ingress import Ingress
    from kubeserve.sdk import transport
    from support.static_source import StaticSource

    loop = asyncio.get_running_loop()
    leaf = await stages.replica_state("Leaf")
    ing, ctl = Ingress(leaf), Control(leaf, None)
    server = ReplicaHttpServer(
        ing.handle,
        control=ctl.handle,
        secret=SECRET,
        identity="leaf-0",
        steps_by_hand={Role.INGRESS: ing.by_hand, Role.CONTROL: ctl.steps_by_hand},
    )
    listener = await loop.create_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    snapshot = {
        "version": 1,
        "routes": [],
        "deployments": {
            "bench#Leaf": {
                "max_ongoing_requests": 100,
                "replicas": [{"replica_id": "leaf-0", "host": "127.0.0.1", "port": port}],
            }
        },
    }
    client = HandleClient(source=StaticSource(snapshot), secret=SECRET)
    await client.start()
    transport.set_transport(client)
    serve = await replica_stages._replica("Chain")
    await serve(stages.REQUEST, 2000)  # warm-up: connections made
    best = min([await serve(stages.REQUEST, N) for _ in range(ROUNDS)]) * 1e6 / N
    calls: Counter = Counter()
    ccalls: Counter = Counter()

    def prof(frame, event, arg):
        if event == "call":
            calls[(frame.f_code.co_filename.split("/")[-1], frame.f_code.co_name)] += 1
        elif event == "c_call":
            ccalls[getattr(arg, "__qualname__", str(arg))] += 1

    n = 1600
    sys.setprofile(prof)
    await serve(stages.REQUEST, n)
    sys.setprofile(None)
    total = sum(calls.values())
    print(
        f"tree {TREE}: chain CPU us/request (in-process, both sides + sockets, best of "
        f"{ROUNDS}x{N}): {best:.1f}"
    )
    print(f"python calls/request: {total / n:.1f}; C calls/request: {sum(ccalls.values()) / n:.1f}")
    if "-v" in sys.argv:
        for (f, name), c in calls.most_common(70):
            print(f"  {c / n:6.2f} {f}:{name}")
    await client.close()
    listener.close()


import uvloop  # noqa: E402

uvloop.run(main())
