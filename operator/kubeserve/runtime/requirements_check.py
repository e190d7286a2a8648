"""``python -m kubeserve.runtime.requirements_check SITE``: the ``pip_check`` / ``uv_check`` of a
runtime_env's environment, run with ``SITE`` first on ``PYTHONPATH``.

It checks what the environment changes: every distribution installed in ``SITE``, and every
distribution of the interpreter underneath that requires one ``SITE`` shadows. A requirement
not installed, or installed at a version outside its specifier, is a line on stderr and exit
code 1 (``pip check``'s wording). Conflicts the interpreter had before are not this
environment's and are not reported.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name


def _problems(site: Path) -> list[str]:
    visible: dict[str, metadata.Distribution] = {}  # by canonical name
    for dist in metadata.distributions():
        name: str = canonicalize_name(dist.metadata["Name"] or "")
        visible.setdefault(name, dist)  # the first on sys.path is the one imported
    ours = {n for n, d in visible.items() if Path(str(d.locate_file(""))).resolve() == site}
    problems: list[str] = []
    for name, dist in sorted(visible.items()):
        for line in dist.requires or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            wanted: str = canonicalize_name(req.name)
            if name not in ours and wanted not in ours:
                continue
            found = visible.get(wanted)
            version = dist.version
            if found is None:
                problems.append(f"{name} {version} requires {req.name}, which is not installed.")
            elif not req.specifier.contains(found.version, prereleases=True):
                problems.append(
                    f"{name} {version} has requirement {req}, but you have "
                    f"{req.name} {found.version}."
                )
    return problems


def main(argv: list[str]) -> int:
    site = Path(argv[0]).resolve()
    problems = _problems(site)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
