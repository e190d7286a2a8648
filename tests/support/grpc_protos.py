"""The Python modules of ``tests/apps/protos/*.proto``, generated with grpcio-tools on demand.

Generated at test time rather than committed: generated code pins the protobuf runtime it
needs, and the one installed is whatever grpcio-tools brought. They land in ``tests/apps`` (on
the path of every ``kubeserve start`` the tests run, so replicas and the proxy import them);
each file is written to a temporary name and renamed, so concurrent test runs never read half of
one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from support.common import ROOT

APPS = ROOT / "tests" / "apps"
PROTOS = APPS / "protos"


def ensure_generated() -> list[str]:
    """Generate every proto's ``*_pb2.py`` and ``*_pb2_grpc.py`` that is missing or older than
    its ``.proto``; returns the module names of the ``_pb2_grpc`` modules."""
    from grpc_tools import protoc

    names = []
    for proto in sorted(PROTOS.glob("*.proto")):
        stem = proto.stem
        names.append(f"{stem}_pb2_grpc")
        outputs = [APPS / f"{stem}_pb2.py", APPS / f"{stem}_pb2_grpc.py"]
        if all(o.exists() and o.stat().st_mtime >= proto.stat().st_mtime for o in outputs):
            continue
        with tempfile.TemporaryDirectory(dir=APPS) as out:
            code = protoc.main(
                [
                    "grpc_tools.protoc",
                    f"-I{PROTOS}",
                    f"--python_out={out}",
                    f"--grpc_python_out={out}",
                    str(proto),
                ]
            )
            if code != 0:
                raise RuntimeError(f"protoc failed on {proto} ({code})")
            for output in outputs:
                os.replace(Path(out) / output.name, output)
    return names
