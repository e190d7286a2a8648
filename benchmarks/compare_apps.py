"""The applications ``compare_trees.py`` loads in both trees (it copies this file into a tree
that lacks it, so an old checkout is measured with the same code).

``noop`` is Ray's default calling convention (a plain method: a worker thread per call),
``async_noop`` the same on the event loop, and ``chain`` an async ingress calling an async
deployment through a handle: every hop of the data plane, with no user work in it.
"""

from kubeserve import DeploymentHandle, Request, deployment


@deployment(max_ongoing_requests=100)
class Noop:
    def __call__(self, request: Request) -> str:
        return "ok"


@deployment(max_ongoing_requests=100)
class AsyncNoop:
    async def __call__(self, request: Request) -> str:
        return "ok"


@deployment(max_ongoing_requests=100)
class Leaf:
    async def answer(self) -> str:
        return "ok"


@deployment(max_ongoing_requests=100)
class Chain:
    def __init__(self, leaf: DeploymentHandle) -> None:
        self.leaf = leaf

    async def __call__(self, request: Request) -> str:
        answer: str = await self.leaf.answer.remote()
        return answer


noop = Noop.bind()
async_noop = AsyncNoop.bind()
chain = Chain.bind(Leaf.bind())
