"""A module of the driver's own, beside its script (not importable by the instance)."""


class Scorer:
    def __init__(self, weight: int):
        self.weight = weight

    def score(self, value: int) -> int:
        return value * self.weight


def tag(score: int) -> str:
    return f"score={score}"
