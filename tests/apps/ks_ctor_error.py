"""Test application whose constructor raises, so its replica must exit 1 with the message."""

from kubeserve import deployment


@deployment
class Broken:
    def __init__(self) -> None:
        raise RuntimeError("constructor refused to start")

    def __call__(self) -> str:
        return "never"


app = Broken.bind()
