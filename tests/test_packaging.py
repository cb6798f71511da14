"""The built wheel holds the whole tree, and an ordinary (non-editable) install of it works.

The project is installed editable for development, which imports every module from the checkout:
a package the build leaves out goes unnoticed there and fails only for a user who installed the
wheel. So these tests build the wheel from a copy of the tree, compare its files with the tree's,
and run the engine, the course and the visualizer from an install of that wheel alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Each source folder and the package it installs as (setup.py: nanovllm/<name> links to <name>/).
ROOTS = {
    "nanovllm": "nanovllm",
    "kernels": "nanovllm/kernels",
    "viz": "nanovllm/viz",
    "lessons": "nanovllm/lessons",
}
PACKAGE_DATA = {".py", ".json", ".safetensors", ".md", ".tcss", ".txt", ".jsonl", ".html", ".c"}
BUILD_FILES = ["pyproject.toml", "setup.py", "README.md"]

# Run before anything else in a child process: drop the editable install's finders, which would
# otherwise serve any module the installed copy lacks from the checkout.
FORGET_EDITABLE = (
    "import sys; "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in str(getattr(f, '__module__', ''))]; "
    "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in str(getattr(h, '__module__', ''))]; "
    "sys.path_importer_cache.clear(); "
)


def tree_files() -> list[str]:
    """The files of the source folders that git tracks or would track (not the ignored ones),
    and the links in nanovllm/ to the folders at the top."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tree's file list comes from git")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *ROOTS],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return sorted(p for p in set(listed) if (REPO / p).is_symlink() or (REPO / p).is_file())


def installed_name(path: str) -> str:
    """Where a source file lands in the wheel: kernels/x.py -> nanovllm/kernels/x.py."""
    folder, rest = path.split("/", 1)
    return f"{ROOTS[folder]}/{rest}"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree (a build in the checkout would leave a build/ folder behind whose
    stale files could stand in for missing ones)."""
    source = tmp_path_factory.mktemp("source")
    for path in BUILD_FILES + tree_files():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, source / path, follow_symlinks=False)  # links as links
    return source


def build_wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(out), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = out.glob("nanovllm-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the tree, as `pip install .` builds it."""
    return build_wheel(source, tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_every_module_and_data_file_of_the_tree(wheel: Path) -> None:
    expected = {installed_name(p) for p in tree_files() if Path(p).suffix in PACKAGE_DATA}
    assert "nanovllm/executor/rejection_sampler.py" in expected
    assert "nanovllm/kernels/reference.py" in expected
    held = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(expected - held) == []


def test_the_wheel_built_from_the_sdist_holds_the_same_files(
    source: Path, wheel: Path, tmp_path: Path
) -> None:
    """`python -m build` (and PyPI's users) build the wheel from the sdist, which holds
    nanovllm/kernels/ and the others as folders, with no links and no folders at the top."""
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=source, check=True, capture_output=True, text=True,
    )  # fmt: skip
    sdist = tmp_path / run.stdout.strip().splitlines()[-1]
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.10.12+, 3.11.4+
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", **safe)
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    assert not (unpacked / "kernels").exists() and (unpacked / "nanovllm/kernels").is_dir()
    from_sdist = build_wheel(unpacked, tmp_path / "wheel")
    names = sorted(zipfile.ZipFile(wheel).namelist())
    assert "nanovllm/viz/widgets/queues.py" in names
    assert sorted(zipfile.ZipFile(from_sdist).namelist()) == names


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed on its own into a folder (no editable link, no dependencies)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target)]
        + [str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    return target


def run_installed(target: Path, code: str, timeout: float = 300, cwd: Path | None = None) -> str:
    """Run `code` where only the installed copy is importable as nanovllm; return its stdout.
    It fails if any nanovllm module it loaded came from elsewhere. It runs in the folder beside
    the install unless `cwd` says otherwise."""
    check = (
        "\nimport sys as _sys\n"
        "_mods = {n: getattr(m, '__file__', None) for n, m in list(_sys.modules.items())}\n"
        "_elsewhere = [n for n, f in _mods.items() if n.split('.')[0] == 'nanovllm' and f\n"
        f"             and not f.startswith({str(target)!r})]\n"
        "assert not _elsewhere, _elsewhere\n"
        "assert 'nanovllm' in _mods, 'nanovllm was not imported'\n"
    )
    script = FORGET_EDITABLE + f"sys.path.insert(0, {str(target)!r})\n" + code + check
    home = target.parent / "nanovllm-home"  # the course copies its exercises there
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd or target.parent,  # by default not the checkout: none of it on the path
        env={**os.environ, "NANOVLLM_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_an_installed_wheel_generates_lists_the_course_and_opens_viz_help(
    installed: Path,
) -> None:
    out = run_installed(
        installed,
        "import nanovllm\n"
        "from nanovllm import LLM, SamplingParams\n"
        "llm = LLM(attention_backend='torch')\n"
        "params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)\n"
        "(result,) = llm.generate(['Once upon a time'], params)\n"
        "print('tokens', len(result.outputs[0].token_ids))\n"
        "print('file', nanovllm.__file__)\n",
    )
    assert "tokens 4" in out
    assert f"file {installed}/nanovllm/__init__.py" in out

    cli = (
        "from nanovllm.cli import main\n"
        "try:\n"
        "    rc = main({argv!r})\n"
        "except SystemExit as e:  # --help exits\n"
        "    rc = e.code or 0\n"
        "assert rc == 0, rc\n"
    )
    lessons = run_installed(installed, cli.format(argv=["lesson"]))
    assert "nanovllm: the course" in lessons and "The KV cache" in lessons
    viz_help = run_installed(installed, cli.format(argv=["viz", "--help"]))
    assert "usage: nanovllm viz" in viz_help


def test_the_wheel_installs_nanovllm_as_its_only_top_level_name(wheel: Path) -> None:
    """kernels/, viz/ and lessons/ go inside nanovllm: a top-level `kernels` would stand in for
    Hugging Face's, which transformers imports."""
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"nanovllm", wheel.name.split("-py3")[0] + ".dist-info"}


def test_an_installed_wheel_run_from_the_repository_root_gets_huggingfaces_kernels(
    installed: Path,
) -> None:
    """Started in the checkout's root, where Python puts the root on the path just behind the
    install, `import kernels` is still the installed one (tests/test_import_names.py asks the
    same of the editable install, every way Python starts)."""
    out = run_installed(
        installed,
        f"sys.path.append({str(REPO / 'tests')!r})\n"  # installed_kernels, not a nanovllm module
        "import installed_kernels\n"
        "from nanovllm.kernels.reference import paged_attention_ref\n"
        "installed_kernels.check()\n"
        "print('checked')\n",
        cwd=REPO,
    )
    assert "checked" in out
