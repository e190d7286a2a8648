"""The Python packages a ``runtime_env`` asks for (``pip`` / ``uv``), as Ray 2.60 accepts them.

Ray's shapes (``ray._private.runtime_env.validation.parse_and_validate_pip`` / ``_uv``):

- a list of requirement lines (``["requests==2.31"]``; a line
  ``-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/r.txt`` names a file of the working_dir);
- a string: a requirements file. Ray reads it on the machine that validates the runtime_env;
  kubeserve reads it where the environment is built, relative to the ``working_dir`` (an
  absolute path names a file on that machine or in the pod's image);
- a dict: ``pip``: ``packages`` (list, or a requirements-file string), ``pip_check``,
  ``pip_version`` (a specifier appended to ``pip``: ``"==23.3.1"``), ``pip_install_options``;
  ``uv``: ``packages`` (list), ``uv_check``, ``uv_version``, ``uv_pip_install_options``.

Duplicates are dropped keeping the first (Ray does), an empty list asks for nothing, and ``pip``,
``uv`` and ``conda`` exclude each other. Pure: nothing here reads a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["PackageSpec", "package_spec", "validate_packages"]

Installer = Literal["pip", "uv"]

_DICT_KEYS: dict[Installer, frozenset[str]] = {
    "pip": frozenset({"packages", "pip_check", "pip_version", "pip_install_options"}),
    "uv": frozenset({"packages", "uv_check", "uv_version", "uv_pip_install_options"}),
}


@dataclass(frozen=True)
class PackageSpec:
    """One environment's packages: what is installed is ``packages`` (or the lines of
    ``requirements_file``) plus ``pip<tool_version>`` for ``pip.pip_version``."""

    installer: Installer
    packages: tuple[str, ...] = ()
    #: a requirements file to read where the environment is built (the string forms)
    requirements_file: str | None = None
    #: ``pip_check`` / ``uv_check``: fail when the layered environment has broken requirements
    check: bool = False
    #: ``pip_version`` / ``uv_version``: a version specifier (``"==24.0"``) or None
    tool_version: str | None = None
    #: ``pip_install_options`` / ``uv_pip_install_options``, passed to ``uv pip install``
    install_options: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "installer": self.installer,
            "packages": list(self.packages),
            "requirements_file": self.requirements_file,
            "check": self.check,
            "tool_version": self.tool_version,
            "install_options": list(self.install_options),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> PackageSpec:
        return cls(
            installer=value["installer"],
            packages=tuple(value.get("packages") or ()),
            requirements_file=value.get("requirements_file"),
            check=bool(value.get("check")),
            tool_version=value.get("tool_version"),
            install_options=tuple(value.get("install_options") or ()),
        )


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(dict.fromkeys(value))


def _parse(installer: Installer, value: Any) -> PackageSpec | None:
    if isinstance(value, str):
        return PackageSpec(installer, requirements_file=value) if value.strip() else None
    if isinstance(value, list):
        packages = _strings(value, installer)
        return PackageSpec(installer, packages) if packages else None
    if not isinstance(value, Mapping):
        raise ValueError(f"{installer} must be a list of requirements, a file or an object")
    unknown = sorted(set(value) - _DICT_KEYS[installer])
    if unknown:
        allowed = ", ".join(sorted(_DICT_KEYS[installer]))
        raise ValueError(f"{installer} can only have the fields {allowed}; got {unknown}")
    if "packages" not in value:
        raise ValueError(f"{installer} must include the field 'packages'")
    check, version = value.get(f"{installer}_check", False), value.get(f"{installer}_version")
    if not isinstance(check, bool):
        raise ValueError(f"{installer}.{installer}_check must be a boolean")
    if version is not None and not isinstance(version, str):
        raise ValueError(f"{installer}.{installer}_version must be a string")
    options_key = "pip_install_options" if installer == "pip" else "uv_pip_install_options"
    options = _strings(value.get(options_key, []), f"{installer}.{options_key}")
    packages = value["packages"]
    if installer == "pip" and isinstance(packages, str):
        base = PackageSpec(installer, requirements_file=packages)
    else:
        base = PackageSpec(installer, _strings(packages, f"{installer}.packages"))
        if not base.packages:
            return None
    return PackageSpec(
        installer,
        base.packages,
        base.requirements_file,
        check=check,
        tool_version=version or None,
        install_options=options,
    )


def package_spec(runtime_env: Mapping[str, Any]) -> PackageSpec | None:
    """The packages ``runtime_env`` asks for (None: none); ``ValueError`` names a bad shape."""
    given = [key for key in ("pip", "uv", "conda") if runtime_env.get(key) is not None]
    if len(given) > 1:
        raise ValueError(f"the fields {', '.join(given)} of a runtime_env exclude each other")
    if runtime_env.get("pip") is not None:
        return _parse("pip", runtime_env["pip"])
    if runtime_env.get("uv") is not None:
        return _parse("uv", runtime_env["uv"])
    return None


def validate_packages(installer: Installer, value: Any) -> Any:
    """``value`` unchanged when it is a valid ``pip`` / ``uv`` field (a pydantic validator)."""
    if value is not None:
        _parse(installer, value)
    return value
