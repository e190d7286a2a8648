"""The pieces of runtime_env pip / uv that need no index: what an install is keyed by, which
index options pip's configuration becomes, the requirements check, the garbage collection."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubeserve.runtime import python_env
from kubeserve.runtime.python_env import PythonEnvError, install_plan, pip_index_options
from kubeserve.schema.packages import PackageSpec, package_spec


def plan(
    spec: PackageSpec, working_dir: Path | None = None, **environ: str
) -> python_env.InstallPlan:
    return install_plan(
        spec, working_dir=working_dir, working_dir_uri=None, env_vars={}, environ=environ
    )


def test_the_list_and_dict_forms_are_one_spec_and_duplicates_go() -> None:
    listed = package_spec({"pip": ["a", "b", "a"]})
    given = package_spec({"pip": {"packages": ["a", "b"]}})
    assert listed == given == PackageSpec("pip", ("a", "b"))
    assert plan(listed).key == plan(given).key  # type: ignore[arg-type]
    assert package_spec({"pip": []}) is None
    assert plan(PackageSpec("uv", ("a", "b"))).key != plan(listed).key  # type: ignore[arg-type]


def test_a_requirements_file_is_read_in_the_working_dir_and_its_content_is_the_key(
    tmp_path: Path,
) -> None:
    (tmp_path / "requirements.txt").write_text("# comment\nalpha==1  # pinned\n-r more.txt\n")
    spec = PackageSpec("uv", requirements_file="requirements.txt")
    first = plan(spec, tmp_path)
    assert first.requirements == ("alpha==1", f"-r {tmp_path / 'more.txt'}")
    (tmp_path / "requirements.txt").write_text("alpha==2\n")
    assert plan(spec, tmp_path).key != first.key
    with pytest.raises(PythonEnvError, match="relative to the working_dir"):
        plan(spec, None)


def test_rays_working_dir_variable_and_pip_version() -> None:
    spec = PackageSpec(
        "pip", ("-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/r.txt",), tool_version="==24.0"
    )
    assert plan(spec, Path("/w")).requirements == ("-r /w/r.txt", "pip==24.0")


def test_pips_configuration_becomes_uv_options(tmp_path: Path) -> None:
    config = configparser.ConfigParser()
    config.read_string(
        "[global]\nindex-url = https://global/simple\ncert = /ca.pem\n"
        f"find-links = {tmp_path} /missing\n"
        "[install]\nextra-index-url = https://x/simple https://y/simple\n"
    )
    options, env = pip_index_options({"PIP_INDEX_URL": "https://env/simple"}, config)
    assert options == [
        "--index-url",
        "https://env/simple",  # the variable wins over the file
        "--extra-index-url",
        "https://x/simple",
        "--extra-index-url",
        "https://y/simple",
        "--find-links",
        str(tmp_path),  # a missing directory is skipped, as pip does
    ]
    assert env == {"SSL_CERT_FILE": "/ca.pem"}
    # uv's own configuration needs nothing: uv reads it, so uv specs carry no pip options
    assert plan(PackageSpec("uv", ("a",)), PIP_INDEX_URL="https://env/simple").options == ()


def test_the_check_reports_what_the_environment_breaks(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "needy-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: needy\nVersion: 1.0\n"
        "Requires-Dist: kubeserve-absent-dependency>=1\n"
        "Requires-Dist: aiohttp<1\n"
        'Requires-Dist: also-absent ; python_version < "3"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "kubeserve.runtime.requirements_check", str(site)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert "needy 1.0 requires kubeserve-absent-dependency, which is not installed." in lines
    assert any(
        line.startswith("needy 1.0 has requirement aiohttp<1, but you have") for line in lines
    )
    assert not any("also-absent" in line for line in lines)  # its marker excludes it


def test_collection_removes_unused_entries_and_leftovers_only(tmp_path: Path) -> None:
    for name in ("used", "unused", "young", "old.tmp-1234"):
        (tmp_path / name / "site").mkdir(parents=True)
    past = time.time() - 3600
    for name in ("used", "unused", "old.tmp-1234"):
        os.utime(tmp_path / name, (past, past))
    removed, young = python_env.collect_garbage(tmp_path, {"used"}, min_age_s=60)
    assert sorted(removed) == ["old.tmp-1234", "unused"]
    assert young  # "young" stays until a later collection
    assert sorted(p.name for p in tmp_path.iterdir()) == ["used", "young"]


def test_envs_named_on_a_running_processs_pythonpath(tmp_path: Path) -> None:
    site = tmp_path / "abc123" / "site"
    env = {**os.environ, "PYTHONPATH": f"/elsewhere:{site}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(30)"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        # until it has exec'd, the child's /proc environ is the parent's (fork): wait for it
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        assert python_env.envs_in_environ([proc.pid, 999_999_999], tmp_path) == {"abc123"}
    finally:
        proc.kill()
        proc.wait()
