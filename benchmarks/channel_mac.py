"""What sealing a data-plane frame costs, by MAC, on this machine (the choice in runtime/sealing.py).

    .venv/bin/python benchmarks/channel_mac.py

For payloads the size of a small request, a 4 KiB answer and a full 256 KiB frame: microseconds
to seal one frame and to open it again with kubeserve's Sealer/Opener (keyed BLAKE2b-128), beside
the standard library's other MACs computed over the same bytes (HMAC-SHA256 one-shot and from a
copied keyed state). Medians of 7 rounds, measured in turns.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import statistics
import timeit
from collections.abc import Callable

from kubeserve.runtime.sealing import MAX_FRAME, Opener, Sealer

SIZES = {"200 B": 200, "4 KiB": 4096, "256 KiB": MAX_FRAME}


def _per_call_us(fn: Callable[[], object], number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6


def main() -> None:
    key = os.urandom(32)
    print(f"{'payload':>8} | {'seal':>8} | {'open':>8} | {'hmac-sha256':>11} | {'hmac copy':>9}")
    for label, size in SIZES.items():
        payload = os.urandom(size)
        number = 20_000 if size < 10_000 else 300
        sealer = Sealer(key)
        frame = Sealer(key).seal(payload)
        hmac_state = hmac.new(key, digestmod=hashlib.sha256)

        def open_one() -> None:
            Opener(key).feed(frame)

        def hmac_copy() -> bytes:
            mac = hmac_state.copy()
            mac.update(payload)
            return mac.digest()

        rounds: dict[str, list[float]] = {"seal": [], "open": [], "hmac": [], "copy": []}
        for _ in range(7):
            rounds["seal"].append(_per_call_us(lambda: sealer.seal(payload), number))
            rounds["open"].append(_per_call_us(open_one, number))
            rounds["hmac"].append(
                _per_call_us(lambda: hmac.digest(key, payload, "sha256"), number)
            )
            rounds["copy"].append(_per_call_us(hmac_copy, number))
        med = {name: statistics.median(values) for name, values in rounds.items()}
        print(
            f"{label:>8} | {med['seal']:7.2f}u | {med['open']:7.2f}u | "
            f"{med['hmac']:10.2f}u | {med['copy']:8.2f}u"
        )


if __name__ == "__main__":
    main()
