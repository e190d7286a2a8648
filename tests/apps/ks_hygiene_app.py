"""Test applications for hostile input and faults: big configs, crashes, children.

* ``sized``: reports the size and a digest of the ``user_config`` it applied;
* ``spawner``: starts ``sleep 777`` in its constructor and reports that child's PID;
* ``crash_at_once``: its constructor exits the process at once;
* ``crash_when_ready``: becomes ready, then exits the process a moment later.
"""

# mypy keeps the class type under a class decorator (python/mypy#3135).
# mypy: disable-error-code="attr-defined"

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from typing import Any

from kubeserve import Request, deployment


@deployment
class Sized:
    def __init__(self) -> None:
        self.size, self.digest = 0, ""

    def reconfigure(self, config: Any) -> None:
        raw = json.dumps(config, sort_keys=True).encode()
        self.size, self.digest = len(raw), hashlib.sha256(raw).hexdigest()

    def __call__(self, request: Request) -> dict[str, Any]:
        return {"size": self.size, "digest": self.digest, "pid": os.getpid()}


@deployment
class Spawner:
    def __init__(self) -> None:
        self.child = subprocess.Popen(["sleep", "777"])

    def __call__(self, request: Request) -> dict[str, int]:
        return {"pid": os.getpid(), "child": self.child.pid}


@deployment
class CrashAtOnce:
    def __init__(self) -> None:
        os._exit(3)

    def __call__(self, request: Request) -> str:
        return "never"


@deployment
class CrashWhenReady:
    def __init__(self) -> None:
        threading.Thread(target=self._die, daemon=True).start()

    @staticmethod
    def _die() -> None:
        time.sleep(0.3)
        os._exit(4)

    def __call__(self, request: Request) -> str:
        return "briefly"


sized = Sized.bind()
spawner = Spawner.bind()
crash_at_once = CrashAtOnce.bind()
crash_when_ready = CrashWhenReady.bind()
