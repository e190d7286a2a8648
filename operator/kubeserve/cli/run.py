"""``kubeserve run``: one application on an embedded instance, for development (like ``serve run``).

The instance lives in a temporary state directory unless ``--state-dir`` is given. With
``--reload``, a change to a ``.py`` file under the working directory gives the application a new
source version (:data:`SOURCE_VERSION_ENV` in its runtime_env), which rebuilds it and replaces its
replicas; the old ones serve until the new ones are ready.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from kubeserve.cli.command import Command
from kubeserve.cli.start import add_instance_arguments, start_instance

if TYPE_CHECKING:
    from kubeserve.admin_client import AdminClient

#: set in a ``kubeserve run --reload`` application's environment: the hash of its source files
SOURCE_VERSION_ENV = "KUBESERVE_SOURCE_VERSION"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("import_path", help="module:application, e.g. app:app or app:build")
    parser.add_argument("--name", default="default", help="the application's name")
    parser.add_argument("--route-prefix", default="/")
    parser.add_argument(
        "--reload",
        action="store_true",
        help="restart the replicas when a .py file under the working directory changes",
    )
    add_instance_arguments(parser, None, "127.0.0.1")


def run(args: argparse.Namespace) -> int:
    app = {"name": args.name, "route_prefix": args.route_prefix, "import_path": args.import_path}
    watched = Path.cwd()

    async def serve_app(client: AdminClient) -> int:
        version = source_version(watched)

        async def apply() -> int:
            env = {"env_vars": {SOURCE_VERSION_ENV: version}} if args.reload else {}
            config = {
                "http_options": {"host": args.http_host, "port": args.http_port},
                "applications": [{**app, "runtime_env": env}],
            }
            return await client.put(config, wait=True, source=args.import_path)

        url = f"http://{args.http_host}:{args.http_port}{args.route_prefix}"
        print(f"kubeserve run: {args.import_path} at {url}", flush=True)
        await apply()
        while args.reload:
            await asyncio.sleep(1.0)
            latest = source_version(watched)
            if latest != version:
                version = latest
                print("kubeserve run: source changed, reloading", flush=True)
                await apply()
        return -1

    if args.state_dir is not None:
        return start_instance(args, serve_app)
    with tempfile.TemporaryDirectory(prefix="kubeserve-run-") as tmp:
        args.state_dir = Path(tmp)
        args.temporary_state_dir = True  # no later start adopts its processes: they die with it
        return start_instance(args, serve_app)


COMMAND = Command(
    "run",
    "run one application on this machine for development (like `serve run`)",
    add_arguments,
    run,
)


def source_version(root: Path) -> str:
    """A fingerprint of the ``.py`` files under ``root`` (names, sizes, modification times)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if any(part.startswith(".") or part == "__pycache__" for part in path.parts):
            continue
        with contextlib.suppress(OSError):
            stat = path.stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
