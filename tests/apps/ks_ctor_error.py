"""Test application whose constructor raises, so its replica must exit 1 with the message."""

# mypy keeps the class type under a class decorator (python/mypy#3135).
# mypy: disable-error-code="attr-defined"

from kubeserve import deployment


@deployment
class Broken:
    def __init__(self) -> None:
        raise RuntimeError("constructor refused to start")

    def __call__(self) -> str:
        return "never"


app = Broken.bind()
