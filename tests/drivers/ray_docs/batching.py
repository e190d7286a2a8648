# Dynamic request batching: @serve.batch on a method, called one sample at a time through a
# handle; the batch parameters changed from user_config in reconfigure.

from ray import serve
from ray.serve.handle import DeploymentHandle


@serve.deployment
class Model:
    def __call__(self, single_sample: int) -> int:
        return single_sample * 2


handle: DeploymentHandle = serve.run(Model.bind())
assert handle.remote(1).result() == 2


@serve.deployment
class BatchedModel:
    def __init__(self):
        self.batch_sizes = []

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.1)
    async def __call__(self, multiple_samples: list[int]) -> list[int]:
        self.batch_sizes.append(len(multiple_samples))
        return [sample * 2 for sample in multiple_samples]

    def largest_batch(self) -> int:
        return max(self.batch_sizes)


handle = serve.run(BatchedModel.bind())
responses = [handle.remote(i) for i in range(8)]
assert list(r.result() for r in responses) == [i * 2 for i in range(8)]
assert handle.largest_batch.remote().result() > 1, "the samples were batched"


@serve.deployment(
    # These values can be overridden in the Serve config.
    user_config={
        "max_batch_size": 3,
        "batch_wait_timeout_s": 0.5,
    }
)
class TunedModel:
    def __init__(self):
        self.batch_sizes = []

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.1)
    async def __call__(self, multiple_samples: list[int]) -> list[int]:
        self.batch_sizes.append(len(multiple_samples))
        return [sample * 2 for sample in multiple_samples]

    def reconfigure(self, user_config: dict):
        self.__call__.set_max_batch_size(user_config["max_batch_size"])
        self.__call__.set_batch_wait_timeout_s(user_config["batch_wait_timeout_s"])

    def largest_batch(self) -> int:
        return max(self.batch_sizes)


handle = serve.run(TunedModel.bind())
responses = [handle.remote(i) for i in range(9)]
assert [r.result() for r in responses] == [i * 2 for i in range(9)]
assert handle.largest_batch.remote().result() <= 3
