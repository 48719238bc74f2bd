"""Style is mechanical: ruff (pyproject.toml's [tool.ruff]) and clang-format (.clang-format, minus
the legacy files of .clang-format-ignore) pass on the repository, and docs/api/ is what
tools/gen_api_docs.py generates. The linters come with the `test` extra; where one is missing
its check is skipped, naming it."""

from __future__ import annotations

import filecmp
import importlib.util
import os
import re
import shutil
import subprocess

import pytest

import _paths

ROOT = str(_paths.ROOT)
CPP_SUFFIXES = (".cc", ".h", ".cpp", ".hpp", ".cu", ".cuh")
# The major version pinned in pyproject.toml's test extra: another one may format differently.
CLANG_FORMAT_MAJOR = 23


def _repo_files() -> list[str]:
    """The files git tracks, and the untracked ones it does not ignore (new files count)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"git is not usable here ({e})")
    if out.returncode != 0:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    return [f for f in out.stdout.splitlines() if os.path.isfile(os.path.join(ROOT, f))]


def _ruff() -> str:
    exe = shutil.which("ruff")
    if exe is None:
        try:
            from ruff.__main__ import find_ruff_bin
            exe = find_ruff_bin()
        except (ImportError, FileNotFoundError):
            pytest.skip("ruff is not installed (it comes with the `test` extra)")
    return exe


def _clang_format() -> str:
    exe = shutil.which("clang-format")
    if exe is None:
        pytest.skip("clang-format is not installed (it comes with the `test` extra)")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.", version)
    if not m or int(m.group(1)) != CLANG_FORMAT_MAJOR:
        pytest.skip(f"clang-format {CLANG_FORMAT_MAJOR} (the pinned one) is not installed: "
                    f"{exe} is {version.strip()!r}")
    return exe


def test_ruff_check_passes():
    r = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "concise", "."],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_clang_format_passes():
    files = [f for f in _repo_files() if f.endswith(CPP_SUFFIXES)]
    assert any(f.startswith("csrc/core/") for f in files)  # the list really holds the sources
    r = subprocess.run([_clang_format(), "--dry-run", "-Werror", *files], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (
        "clang-format would change these files (run `clang-format -i FILE`):\n"
        + r.stdout + r.stderr[-8000:])


def test_clang_format_ignore_lists_only_existing_files():
    """A legacy file that was renamed or deleted leaves the list, so it can only shrink."""
    with open(os.path.join(ROOT, ".clang-format-ignore")) as f:
        entries = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    assert entries == sorted(entries)
    missing = [e for e in entries if not os.path.isfile(os.path.join(ROOT, e))]
    assert not missing, f".clang-format-ignore lists files that do not exist: {missing}"


def test_api_docs_are_generated_from_the_current_docstrings(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "gen_api_docs", os.path.join(ROOT, "tools", "gen_api_docs.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    skipped = gen.generate(str(tmp_path))
    if skipped:
        pytest.skip(f"modules not importable here, so their pages cannot be compared: {skipped}")
    committed = os.path.join(ROOT, "docs", "api")
    assert sorted(os.listdir(tmp_path)) == sorted(os.listdir(committed))
    stale = [n for n in os.listdir(tmp_path)
             if not filecmp.cmp(tmp_path / n, os.path.join(committed, n), shallow=False)]
    assert not stale, f"docs/api/ is stale for {stale}: run python tools/gen_api_docs.py"
