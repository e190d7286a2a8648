"""Import an application and describe its deployment graph: ``python -m kubeserve.runtime.build
PATH``, or ``python -m kubeserve.runtime.build --pickled < GRAPH`` for an application deployed
imperatively (``serve.run``: the graph pickled by the driver, read from stdin; ``--pickled-file
FILE`` reads it from a file, the mounted Secret of a Kubernetes build Job).

The controller runs this in a subprocess (a Kubernetes Job on that backend) whose working directory,
``PYTHONPATH`` and environment the runtime_env already prepared, so importing user code never
happens in the controller itself. The process prints exactly one JSON document on stdout:

* success (exit 0)::

    {"ingress": "Ingress",
     "deployments": [{"name": "Ingress", "options": {...}, "is_function": false,
                      "outbound": ["Model"], "is_ingress": true}, ...]}

  ``deployments`` lists the ingress first, then the others depth-first in argument order;
  ``options`` holds only the options set in code, under their REST names (see
  :data:`kubeserve.sdk.deployment.OPTION_NAMES`); ``outbound`` names the deployments whose handles
  this one receives in its constructor arguments; ``docs_path`` (present only for a FastAPI
  ingress) is where the app serves its docs, below the route prefix.
* failure (exit 1): ``{"error": "<exception type and text, then the last frames of user code>"}``.

Anything the user's module prints while it is imported goes to stderr, so stdout stays parseable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import sys
import traceback
import typing
from collections.abc import Callable, Coroutine
from typing import Any

from kubeserve.runtime import parent_death
from kubeserve.runtime.tracing import TracingSetupError
from kubeserve.sdk import context, ray_namespace
from kubeserve.sdk.application import Application
from kubeserve.sdk.deployment import Deployment, described_options
from kubeserve.sdk.ingress import asgi_app_of

#: How many of the innermost user frames an error report keeps.
ERROR_FRAMES = 5


#: Writes a build's document where the operator reads it: ``(namespace, configmap, document,
#: application, application_uid)``; idempotent (a retried Job may write it again).
GraphWriter = Callable[[str, str, str, str, str], Coroutine[Any, Any, None]]


class BuildError(Exception):
    """The import path does not lead to a bound application."""


def load_application(import_path: str, args: dict[str, Any] | None = None) -> Application:
    """Import ``module:attr`` or ``module.attr`` and return the bound application it names.

    The attribute is a bound application, or an *application builder*: a function called with
    the config's ``args`` (a dict, or the pydantic model its first parameter is annotated with)
    that returns one. ``args`` given for a bound application is an error, as in Ray Serve.
    Exceptions raised while importing the user's module (or by a builder) propagate unchanged; a
    path without a module, a missing attribute or an attribute of the wrong type raise
    :class:`BuildError`.
    """
    module_name, attr_path = split_import_path(import_path)
    prepare_for_user_code()
    module = importlib.import_module(module_name)
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise BuildError(
                f"module {module_name!r} has no attribute {attr_path!r} "
                f"(import_path {import_path!r})"
            ) from None
    if isinstance(target, Application):
        if args:
            raise BuildError(
                f"args were given but {import_path!r} is a bound application; args can only "
                "be passed to an application builder (a function taking args)"
            )
        return target
    if callable(target) and not isinstance(target, Deployment | type):
        built = target(_builder_argument(target, args or {}))
        if isinstance(built, Application):
            return built
        raise BuildError(
            f"the application builder {import_path!r} must return a bound application "
            f"(Deployment.bind()), got {type(built).__name__}"
        )
    if isinstance(target, Deployment):
        raise BuildError(
            "import_path must point to a bound application (call .bind()); "
            f"{import_path!r} is the deployment {target.name!r}"
        )
    raise BuildError(
        "import_path must point to a bound application (call .bind()); "
        f"{import_path!r} is a {type(target).__name__}"
    )


def load_pickled_application(data: bytes) -> Application:
    """The application a driver's ``serve.run`` pickled (see
    :mod:`kubeserve.sdk.pickled_application`); raises what unpickling raises."""
    from kubeserve.sdk.pickled_application import unpickle_application  # imperative apps only

    prepare_for_user_code()
    return unpickle_application(data)


def _pickled_input(path: str | None) -> bytes:
    """The pickled graph: the file at ``path``, else stdin."""
    if path is None:
        return sys.stdin.buffer.read()
    with open(path, "rb") as file:
        return file.read()


def prepare_for_user_code() -> None:
    ray_namespace.install()  # a Ray Serve application's `from ray import serve` is kubeserve's
    context.mark_kubeserve_process()  # its `serve.run` returns at once here (never waits on us)


def _builder_argument(builder: Any, args: dict[str, Any]) -> Any:
    """``args`` as the builder takes it: validated into the pydantic model its first parameter
    is annotated with, else the dict itself."""
    try:
        hints = typing.get_type_hints(builder)
        first = next(iter(inspect.signature(builder).parameters), None)
    except (TypeError, ValueError, NameError):
        return args
    annotation = hints.get(first) if first is not None else None
    # A pydantic model annotation means its module imported pydantic: never imported here, so a
    # replica whose application does not use pydantic does not pay its memory.
    pydantic = sys.modules.get("pydantic")
    if (
        pydantic is not None
        and inspect.isclass(annotation)
        and issubclass(annotation, pydantic.BaseModel)
    ):
        return annotation.model_validate(args)  # type: ignore[attr-defined]
    return args


def split_import_path(import_path: str) -> tuple[str, str]:
    if ":" in import_path:
        module_name, _, attr = import_path.partition(":")
    else:
        module_name, _, attr = import_path.rpartition(".")
    if not module_name or not attr:
        raise BuildError(
            f"import_path {import_path!r} must look like 'module.submodule:app' or 'module.app'"
        )
    return module_name, attr


def describe_application(app: Application) -> dict[str, Any]:
    """The JSON-ready description of a bound application's graph (format: module docstring)."""
    nodes = app.deployments()
    deployments = []
    for name, deployment, args, kwargs in nodes:
        node = Application(deployment, args, kwargs)
        deployments.append(
            {
                "name": name,
                "options": described_options(deployment.code_options),
                "is_function": deployment.is_function,
                "outbound": [child.name for child in node.children()],
                "is_ingress": name == app.name,
            }
        )
    description: dict[str, Any] = {"ingress": app.name, "deployments": deployments}
    docs_url = getattr(asgi_app_of(app.deployment.func_or_class), "docs_url", None)
    if isinstance(docs_url, str):  # a FastAPI ingress serves its docs there, as on Ray
        description["docs_path"] = docs_url
    return description


def describe(import_path: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Import ``import_path`` and describe its graph; raises what the import or the graph raised."""
    return describe_application(load_application(import_path, args))


def check_tracing(config: dict[str, Any] | None) -> None:
    """Raise :class:`BuildError` naming ``tracing_config``'s field when the application's
    processes (this one's image and runtime_env) could not trace as ``config`` asks:
    OpenTelemetry missing, or an ``exporter_import_path`` that does not import (its function is
    looked up, not called). On Kubernetes the operator cannot import the user's modules: the
    build is where a bad exporter fails the application, rather than its pods later."""
    from kubeserve.runtime import tracer

    cannot = tracer.unavailable(config, sys.path)
    if cannot is not None:
        raise BuildError(f"tracing_config.{cannot[0]}: {cannot[1]}")
    path = str((config or {}).get("exporter_import_path") or "")
    if config and config.get("enabled") and path:
        try:
            tracer.import_exporter(path)
        except TracingSetupError as exc:
            raise BuildError(exc.named()) from exc


def format_user_error(exc: BaseException) -> str:
    """``Type: text`` followed by the innermost frames of the traceback, kubeserve's frames dropped,
    so the message points at the user's line without the importer's noise."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if "importlib" not in frame.filename and not frame.filename.endswith("runtime/build.py")
    ][-ERROR_FRAMES:]
    if isinstance(exc, BuildError):
        return str(exc)
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if not frames:
        return message
    where = "".join(traceback.format_list(frames)).rstrip()
    return f"{message}\nTraceback (most recent call last):\n{where}"


def main(
    argv: list[str] | None = None,
    *,
    write_graph: GraphWriter | None = None,
    namespace: str = "default",
) -> int:
    """Describe an application: print the JSON (or an error document) and return the exit code.

    With ``--configmap`` (the Kubernetes build Job), the same document is also written to that
    ConfigMap, owned by the ``ServeApplication`` named by ``--application``/``--application-uid``,
    where the operator reads it, by ``write_graph`` (given by the command's composition root,
    :mod:`kubeserve.runtime.kubernetes.pod`); ``namespace`` is ``--namespace``'s default.
    """
    parser = argparse.ArgumentParser(prog="kubeserve build")
    parser.add_argument("import_path", nargs="?", default="")
    parser.add_argument(
        "--pickled", action="store_true", help="read a pickled graph (serve.run's) from stdin"
    )
    parser.add_argument(
        "--pickled-file", metavar="PATH", help="read a pickled graph (serve.run's) from PATH"
    )
    parser.add_argument("--args", default="{}", help="the application's args, as JSON")
    parser.add_argument("--configmap")
    parser.add_argument("--namespace", default=namespace)
    parser.add_argument("--application", default="")
    parser.add_argument("--application-uid", default="")
    parser.add_argument(
        "--tracing-config",
        type=json.loads,
        help="the instance's tracing_config as JSON: its exporter must import here too",
    )
    parser.add_argument(
        "--parent-pid", type=int, default=0, help="exit when this process (the caller) exits"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.parent_pid:
        parent_death.die_with(args.parent_pid)
    if args.configmap and write_graph is None:
        parser.error("--configmap: this command writes no ConfigMap (`kubeserve build` does)")
    pickled = args.pickled or bool(args.pickled_file)
    if bool(args.import_path) == pickled or (args.pickled and args.pickled_file):
        parser.error(
            "give an import path, or --pickled with the graph on stdin, or --pickled-file PATH"
        )
    try:
        with contextlib.redirect_stdout(sys.stderr):
            if pickled:
                app = load_pickled_application(_pickled_input(args.pickled_file))
                document = describe_application(app)
            else:
                document = describe(args.import_path, json.loads(args.args))
            check_tracing(args.tracing_config)
        code = 0
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        document, code = {"error": format_user_error(exc)}, 1
    text = json.dumps(document)
    print(text)
    if args.configmap and write_graph is not None:
        asyncio.run(
            write_graph(
                args.namespace, args.configmap, text, args.application, args.application_uid
            )
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
