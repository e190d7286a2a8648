"""What sealing a data-plane frame costs on this machine (the MAC choice in runtime/sealing.py).

    .venv/bin/python benchmarks/channel_mac.py

For payloads the size of a small request, a 1 KiB and a 4 KiB answer and a full 256 KiB frame:
microseconds to seal one frame and to open it with kubeserve's Sealer/Opener, beside keyed
BLAKE2b and HMAC-SHA256 (from a copied keyed state, as the Sealer uses them) over the same bytes.
Medians of 7 rounds, measured in turns.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import statistics
import timeit
from collections.abc import Callable

from kubeserve.runtime.sealing import MAX_FRAME, Opener, Sealer

SIZES = {"200 B": 200, "1 KiB": 1024, "4 KiB": 4096, "256 KiB": MAX_FRAME}


def _per_call_us(fn: Callable[[], object], number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6


def measure(size: int) -> dict[str, float]:
    """Median microseconds per call of each way to tag ``size`` bytes."""
    key = os.urandom(32)
    payload = os.urandom(size)
    number = 20_000 if size < 10_000 else 300
    sealer = Sealer(key)
    frames = [Sealer(key).seal(payload)]
    blake = hashlib.blake2b(key=key, digest_size=16)
    sha = hmac.new(key, digestmod=hashlib.sha256)

    def open_one() -> None:
        opener = Opener(key)
        opener.feed(frames[0])

    def construct() -> None:
        Opener(key)

    def tag(base: hashlib._Hash | hmac.HMAC) -> Callable[[], bytes]:
        def run() -> bytes:
            mac = base.copy()
            mac.update(payload)
            return mac.digest()

        return run

    ways: dict[str, Callable[[], object]] = {
        "seal": lambda: sealer.seal(payload),
        "open+new": open_one,
        "new": construct,
        "blake2b": tag(blake),
        "hmac-sha256": tag(sha),
    }
    rounds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(7):
        for name, way in ways.items():
            rounds[name].append(_per_call_us(way, number))
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    medians["open"] = medians.pop("open+new") - medians.pop("new")
    return medians


def main() -> None:
    columns = ["seal", "open", "blake2b", "hmac-sha256"]
    print("| payload | " + " | ".join(f"{c} (us)" for c in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for label, size in SIZES.items():
        medians = measure(size)
        print(f"| {label} | " + " | ".join(f"{medians[c]:.2f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
