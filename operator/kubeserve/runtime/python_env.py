"""The Python packages of a runtime_env (``pip`` / ``uv``), installed with uv.

An environment is a directory ``<root>/<key>`` whose ``site`` subdirectory holds the installed
packages (``uv pip install --target``). Processes run on kubeserve's own interpreter with ``site``
*prepended* to ``PYTHONPATH`` (after the working_dir and py_modules): the user's packages win,
kubeserve and its dependencies stay importable. Not a virtualenv with system site-packages:
virtualenvs do not chain, so one made over kubeserve's interpreter, itself often a virtualenv,
would lose kubeserve; a target directory layers the same way over any interpreter, and the
process's command (locally, and in a pod's template) stays what it is.

Invariants:

- ``key`` is a digest of everything that decides the result: the requirement lines (a
  requirements file's content included), the install options (the index pip's configuration
  names included), the check, the tool version, the interpreter. Every replica, build and policy
  process asking for the same key shares one directory;
- an entry exists only complete: uv installs into ``<key>.tmp-*``, which is renamed into place;
  within an event loop concurrent builds of one key share a single install;
- files are hard-linked from uv's cache (uv's default on Linux; the cache is uv's configured one,
  so a second environment with the same packages costs a resolve and links, not downloads);
- :func:`collect_garbage` removes the entries nothing uses (see its docstring for when).

Indexes: uv reads its own configuration (``uv.toml``, ``UV_INDEX_URL``...) as always. For a
``pip`` field, pip's configuration (``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, ``PIP_FIND_LINKS``,
``PIP_TRUSTED_HOST``, ``PIP_CERT`` and the same keys in pip's configuration files) is translated
into uv's options, since uv does not read it. ``runtime_env.env_vars`` are in the installer's
environment, as in Ray.
"""

from __future__ import annotations

import asyncio
import configparser
import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubeserve.schema.packages import PackageSpec

__all__ = [
    "SITE",
    "InstallPlan",
    "PythonEnvError",
    "build",
    "collect_garbage",
    "envs_in_environ",
    "install_plan",
    "pip_index_options",
]

SITE = "site"
#: Ray's variable naming the unpacked working_dir while an environment is built
WORKING_DIR_VAR = "RAY_RUNTIME_ENV_CREATE_WORKING_DIR"
#: an unused entry younger than this survives a collection (one being handed to its users)
GC_MIN_AGE_S = 60.0
_TAIL_LINES = 20
_ENV_VAR = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)
_TMP = ".tmp-"


class PythonEnvError(Exception):
    """The environment cannot be built; the message ends with the installer's last lines."""


@dataclass(frozen=True)
class InstallPlan:
    """Everything one install needs, resolved on the machine that builds (pure data)."""

    spec: PackageSpec
    requirements: tuple[str, ...]
    options: tuple[str, ...]
    #: variables added to the installer's environment
    env: Mapping[str, str]
    key: str

    def describe(self) -> str:
        shown = ", ".join(self.requirements[:5]) + (" ..." if len(self.requirements) > 5 else "")
        return f"runtime_env.{self.spec.installer} [{shown}]"


# --------------------------------------------------------------------------- planning (pure)


def _expand(value: str, env: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1).strip("{}")
        return env.get(name, match.group(0))

    return _ENV_VAR.sub(replace, value)


_FILE_OPTION = re.compile(r"^(-r|-c|--requirement|--constraint)(\s*=?\s*)(\S.*)$")


def _anchored(line: str, working_dir: Path | None) -> str:
    """A ``-r`` / ``-c`` line naming a relative file names it in the working_dir."""
    match = _FILE_OPTION.match(line)
    if match is None or working_dir is None or os.path.isabs(match.group(3)):
        return line
    return f"{match.group(1)} {working_dir / match.group(3)}"


def _requirement_lines(text: str) -> list[str]:
    lines = (line.split(" #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def pip_index_options(
    environ: Mapping[str, str], config: configparser.ConfigParser
) -> tuple[list[str], dict[str, str]]:
    """pip's index settings as uv options and variables: ``PIP_*`` variables win over the
    ``[install]`` section, which wins over ``[global]``, as in pip."""

    def setting(name: str) -> str | None:
        env_name = "PIP_" + name.upper().replace("-", "_")
        if env_name in environ:
            return environ[env_name]
        for section in ("install", "global"):
            if config.has_option(section, name):
                return config.get(section, name)
        return None

    options: list[str] = []
    if (index := setting("index-url")) is not None:
        options += ["--index-url", index]
    for name, flag in (
        ("extra-index-url", "--extra-index-url"),
        ("find-links", "--find-links"),
        ("trusted-host", "--allow-insecure-host"),
    ):
        for value in (setting(name) or "").split():
            if flag == "--find-links" and "://" not in value and not os.path.isdir(value):
                continue  # pip skips a missing directory; uv would fail
            options += [flag, value]
    if (setting("no-index") or "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    env: dict[str, str] = {}
    if (cert := setting("cert")) and "SSL_CERT_FILE" not in environ:
        env["SSL_CERT_FILE"] = cert
    return options, env


def pip_config_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's configuration files, lowest precedence first (global, user, ``PIP_CONFIG_FILE``)."""
    xdg_dirs = environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    home = Path(environ.get("HOME", "~")).expanduser()
    config_home = Path(environ.get("XDG_CONFIG_HOME", str(home / ".config")))
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d]
    files += [Path("/etc/pip.conf"), home / ".pip" / "pip.conf", config_home / "pip" / "pip.conf"]
    if environ.get("PIP_CONFIG_FILE"):
        files.append(Path(environ["PIP_CONFIG_FILE"]))
    return files


def _read_pip_config(environ: Mapping[str, str]) -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None)
    if environ.get("PIP_CONFIG_FILE") == os.devnull:
        return config
    config.read([str(f) for f in pip_config_files(environ)])
    return config


def install_plan(
    spec: PackageSpec,
    *,
    working_dir: Path | None,
    working_dir_uri: str | None,
    env_vars: Mapping[str, str],
    environ: Mapping[str, str],
) -> InstallPlan:
    """What to install for ``spec`` here; reads the requirements file (and pip's configuration)."""
    env = dict(env_vars)
    if working_dir is not None:
        env[WORKING_DIR_VAR] = str(working_dir)
    expand_env = {**environ, **env}
    lines = list(spec.packages)
    if spec.requirements_file is not None:
        lines = _requirement_lines(_read_requirements(spec.requirements_file, working_dir))
    requirements = [_anchored(_expand(line, expand_env), working_dir) for line in lines]
    if spec.installer == "pip" and spec.tool_version:
        requirements.append(f"pip{spec.tool_version}")
    options = [_expand(option, expand_env) for option in spec.install_options]
    if spec.installer == "pip":
        index_options, index_env = pip_index_options(environ, _read_pip_config(environ))
        options = index_options + options
        env |= index_env
    identity = {
        "spec": spec.as_json(),
        "requirements": requirements,
        "options": options,
        # a -r line may name a file of the working_dir: its content is identified by its URI
        "working_dir": working_dir_uri,
        "python": [sys.implementation.cache_tag, sys.version, sys.platform, os.uname().machine],
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:40]
    return InstallPlan(spec, tuple(requirements), tuple(options), env, key)


def _read_requirements(name: str, working_dir: Path | None) -> str:
    path = Path(name)
    if not path.is_absolute():
        if working_dir is None:
            raise PythonEnvError(
                f"the requirements file {name!r} is relative to the working_dir, and the "
                f"runtime_env has none"
            )
        path = working_dir / path
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise PythonEnvError(f"cannot read the requirements file {name!r}: {err}") from err


def install_command(uv: str, plan: InstallPlan, target: Path, requirements: Path) -> list[str]:
    """``uv pip install`` of ``plan`` into ``target``, for this interpreter."""
    version = plan.spec.tool_version
    runner = [uv]
    if plan.spec.installer == "uv" and version and not _satisfies(_uv_version(uv), version):
        runner = [uv, "tool", "run", "--from", f"uv{version}", "uv"]
    return [
        *runner,
        "pip",
        "install",
        "--target",
        str(target),
        "--python",
        sys.executable,
        "-r",
        str(requirements),
        *plan.options,
    ]


# --------------------------------------------------------------------------- building


_inflight: dict[Path, asyncio.Task[Path]] = {}


async def build(
    plan: InstallPlan,
    root: Path,
    *,
    cwd: Path | None = None,
    on_install: Callable[[str], None] | None = None,
) -> Path:
    """The ``site`` directory of ``plan``'s environment, installing it unless present.

    ``on_install`` is told (once per actual install) what is being installed.
    """
    entry = root / plan.key
    if await asyncio.to_thread(_touch_if_complete, entry):
        return entry / SITE
    task = _inflight.get(entry)
    if task is None or task.get_loop() is not asyncio.get_running_loop():
        if on_install is not None:
            on_install(plan.describe())
        task = asyncio.ensure_future(_install(plan, entry, cwd))
        _inflight[entry] = task
        task.add_done_callback(
            lambda t: _inflight.pop(entry, None) if _inflight.get(entry) is t else None
        )
    return await asyncio.shield(task)


def _touch_if_complete(entry: Path) -> bool:
    if not (entry / SITE).is_dir():
        return False
    os.utime(entry)  # used now: a collection leaves it for GC_MIN_AGE_S at least
    return True


async def _install(plan: InstallPlan, entry: Path, cwd: Path | None) -> Path:
    staging = entry.with_name(f"{entry.name}{_TMP}{uuid.uuid4().hex}")
    await asyncio.to_thread(staging.mkdir, parents=True)
    try:
        requirements = staging / "requirements.txt"
        await asyncio.to_thread(requirements.write_text, "\n".join(plan.requirements) + "\n")
        uv = _uv_binary()
        command = install_command(uv, plan, staging / SITE, requirements)
        await _run(command, plan, staging, cwd)
        if plan.spec.check:
            site = staging / SITE
            await _run(_check_command(site), plan, staging, cwd, python_path=str(site))
        await asyncio.to_thread(_publish, staging, entry)
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
    return entry / SITE


def _publish(staging: Path, entry: Path) -> None:
    os.utime(staging)
    try:
        staging.rename(entry)
    except OSError as err:
        if not (entry / SITE).is_dir():  # not a lost race with another process
            raise PythonEnvError(f"cannot store the environment in {entry.parent}: {err}") from err


async def _run(
    command: list[str],
    plan: InstallPlan,
    staging: Path,
    cwd: Path | None,
    python_path: str | None = None,
) -> None:
    env = {**os.environ, **plan.env}
    if python_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [python_path, env.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(cwd or staging),
        env=env,
    )
    try:
        output, _ = await proc.communicate()
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    text = output.decode(errors="replace")
    await asyncio.to_thread(_append, staging / "install.log", text)
    if proc.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-_TAIL_LINES:])
        what = "checking" if python_path else "installing"
        how = "" if python_path else " with uv"  # the installer, named for whoever reads the tail
        raise PythonEnvError(
            f"{what} {plan.describe()}{how} failed (exit code {proc.returncode}):\n{tail}"
        )


def _append(path: Path, text: str) -> None:
    with path.open("a") as out:
        out.write(text)


def _check_command(site: Path) -> list[str]:
    return [sys.executable, "-m", "kubeserve.runtime.requirements_check", str(site)]


def _uv_binary() -> str:
    try:
        from uv import find_uv_bin
    except ImportError as err:  # pragma: no cover - uv is a dependency of kubeserve
        raise PythonEnvError("uv is not installed alongside kubeserve") from err
    return str(find_uv_bin())


def _uv_version(uv: str) -> str:
    import subprocess

    out = subprocess.run([uv, "--version"], capture_output=True, text=True, check=False).stdout
    parts = out.split()
    return parts[1] if len(parts) > 1 else "0"


def _satisfies(version: str, specifier: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(specifier).contains(version, prereleases=True)
    except InvalidSpecifier:
        return False


# --------------------------------------------------------------------------- collecting


def envs_in_environ(pids: Iterable[int], root: Path) -> set[str]:
    """Keys of the environments under ``root`` on the ``PYTHONPATH`` of the processes ``pids``
    (read from ``/proc``: this names what a running process uses even when the controller that
    started it is gone)."""
    keys: set[str] = set()
    prefix = str(root) + os.sep
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"PYTHONPATH="):
                for part in item[len(b"PYTHONPATH=") :].decode(errors="replace").split(":"):
                    if part.startswith(prefix):
                        keys.add(part[len(prefix) :].split(os.sep)[0])
    return keys


def collect_garbage(
    root: Path, in_use: Collection[str], *, min_age_s: float = GC_MIN_AGE_S
) -> tuple[list[str], bool]:
    """Remove the environments under ``root`` whose key is not ``in_use``; blocking.

    An entry used (built or found) less than ``min_age_s`` ago stays: it may be on its way to
    the process that asked for it. Staging directories of installs this process is not running
    are leftovers of an interrupted run and go too. Returns the removed names, and whether an
    unused entry stayed for its age (a later collection should look again).
    """
    if not root.is_dir():
        return [], False
    building = {path.name for path in _inflight}
    now = time.time()
    removed: list[str] = []
    young = False
    for child in root.iterdir():
        key = child.name.split(_TMP)[0]
        if key in in_use or key in building:
            continue
        try:
            if _TMP not in child.name and now - child.stat().st_mtime < min_age_s:
                young = True
                continue
        except OSError:
            continue
        shutil.rmtree(child, ignore_errors=True)
        removed.append(child.name)
    return removed, young
