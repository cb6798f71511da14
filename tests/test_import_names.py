"""From the repository's root, no top-level folder of ours stands in for an installed package.

Python puts the folder it starts in (`python -c`, `python -m`, `python -m pytest`) or the
script's folder (`python script.py`) first on `sys.path`, so a package at the repository's root
is imported in place of an installed package of the same name. transformers 5.25 imports Hugging
Face's `kernels` when it loads a model, and from the root it found our `kernels/` instead. So
`kernels/`, `viz/`, `lessons/` and `tests/` have no `__init__.py`: Python sees each at most as a
namespace portion (PEP 420), and an installed package of that name wins over it wherever it
stands on the path (README, "The top-level folders").

The oracle is Python's import system itself, asked in child processes started from the root
each way Python is started there, against the same question asked from a folder outside the
checkout: standing at the root must change nothing that is installed. `viz`, `lessons` and
`tests` are not installed here, so a folder later on the path (`PYTHONPATH`, behind the start
folder as site-packages is) holds a package of each name; `kernels` is Hugging Face's, installed
with transformers.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the README's quick tier, run from the root, needs this

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
# The repository's top-level folders of Python files other than nanovllm/ itself.
FOLDERS = ["kernels", "viz", "lessons", "tests"]
INSTALLED_ELSEWHERE = ["viz", "lessons", "tests"]  # stood in for by packages in `site`

# Prints, for each name, what `import name` would load: the file of a module or a regular
# package, "namespace" for a namespace package, or null when there is none.
PROBE = textwrap.dedent(
    f"""
    import importlib.util, json
    found = {{}}
    for name in {FOLDERS!r}:
        spec = importlib.util.find_spec(name)
        found[name] = None if spec is None else (spec.origin if spec.loader else "namespace")
    print("PROBE" + json.dumps(found))
    """
)


def _found(output: str) -> dict[str, str | None]:
    (line,) = [line for line in output.splitlines() if line.startswith("PROBE")]
    return json.loads(line.removeprefix("PROBE"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of installed packages named like our folders, and the probe as a module."""
    site = tmp_path_factory.mktemp("site")
    for name in INSTALLED_ELSEWHERE:
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("INSTALLED = True\n")
    (site / "import_probe.py").write_text(PROBE)
    return site


def _python(args: list[str], cwd: Path, site: Path, timeout: float = 120) -> str:
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("PYTHONSAFEPATH", None)  # Python 3.11's opt-out of the start folder: not the default
    run = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _from_the_root(how: str, site: Path, tmp_path: Path) -> dict[str, str | None]:
    """The probe, run from the repository's root the way `how` starts Python there."""
    if how == "python -c":
        return _found(_python(["-c", PROBE], REPO, site))
    if how == "python -m module":
        return _found(_python(["-m", "import_probe"], REPO, site))
    if how == "python script.py":  # a learner's script saved at the root
        script = REPO / f"probe_{uuid.uuid4().hex}.py"
        script.write_text(PROBE)
        try:
            return _found(_python([script.name], REPO, site))
        finally:
            script.unlink()
    if how == "python -m pytest":
        # The test file outside the checkout, so that its folder (which pytest puts first on the
        # path) is not the root; the root is first behind it, as `python -m pytest` puts it.
        folder = tmp_path / "probe_tests"
        folder.mkdir()
        (folder / "test_probe.py").write_text(
            f"def test_probe():\n{textwrap.indent(PROBE, '    ')}\n"
        )
        out = _python(
            ["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(folder)], REPO, site
        )
        return _found(out)
    raise ValueError(how)


@pytest.mark.parametrize(
    "how", ["python -c", "python -m module", "python script.py", "python -m pytest"]
)
def test_an_installed_package_wins_over_each_top_level_folder(
    how: str, site: Path, tmp_path: Path
) -> None:
    installed = _found(_python(["-c", PROBE], tmp_path, site))  # outside the checkout
    for name in INSTALLED_ELSEWHERE:
        assert installed[name] == str(site / name / "__init__.py")
    at_root = _from_the_root(how, site, tmp_path)
    for name in FOLDERS:
        if installed[name] is not None:
            assert at_root[name] == installed[name], (
                f"from the root, `import {name}` finds {at_root[name]}, "
                f"not the installed {installed[name]}"
            )
        else:  # nothing installed: at most our folder as a namespace, none of its code runs
            assert at_root[name] in (None, "namespace"), (name, at_root[name])


def test_this_test_process_imports_no_folder_of_ours_by_its_top_level_name() -> None:
    """The suite's own process (`python -m pytest` from the root, with tests/ put first on the
    path by conftest.py, which exposes tests/kernels/ and tests/viz/ too) finds no regular
    package of ours under a top-level name."""
    import importlib.util

    ours = [REPO / folder for folder in FOLDERS]  # tests/kernels/ and tests/viz/ among them
    for name in FOLDERS:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            origin = Path(spec.origin).resolve()
            assert not any(origin.is_relative_to(folder) for folder in ours), (name, origin)


def test_transformers_and_the_engine_load_a_checkpoint_from_the_repository_root(
    tiny_llama: Path, site: Path
) -> None:
    """From the root, `import kernels` is Hugging Face's (transformers depends on it), and a
    checkpoint loads into transformers as the oracle tests load it and into the engine, with
    the same greedy tokens."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.append({str(TESTS)!r})  # tiny_models, as conftest.py makes it importable
        import installed_kernels
        installed = installed_kernels.check()

        import torch
        from transformers import AutoModelForCausalLM
        from tiny_models import greedy_continuation
        from nanovllm import LLM, SamplingParams

        path = {str(tiny_llama)!r}
        prompt = [5, 17, 42, 99, 3]
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.generation_config.eos_token_id = None
        model.config.eos_token_id = None
        want = greedy_continuation(model, prompt, 6)
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        (out,) = LLM(path).generate([{{"prompt_token_ids": prompt}}], params)
        got = list(out.outputs[0].token_ids)
        assert got == want, (got, want)
        print("kernels installed:", installed, "| tokens:", got)
        """
    )
    assert "tokens:" in _python(["-c", code], REPO, site, timeout=300)


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_our_code_reaches_the_folders_only_by_their_installed_names() -> None:
    """No file imports `kernels`, `viz`, `lessons` or `tests` by that top-level name: the first
    three are `nanovllm.kernels`, `nanovllm.viz`, `nanovllm.lessons`, and a test reaches a helper
    in tests/ by the helper's own module name (conftest.py puts tests/ on the path). The one
    exception imports Hugging Face's `kernels` on purpose, to check that it is the one imported."""
    installed_on_purpose = {("tests/installed_kernels.py", "kernels")}
    files = [p for folder in ["nanovllm", *FOLDERS] for p in (REPO / folder).rglob("*.py")]
    assert len(files) > 300
    wrong = sorted(
        f"{path.relative_to(REPO)}: {name}"
        for path in files
        if "__pycache__" not in path.parts
        for name in _top_level_imports(path) & set(FOLDERS)
        if (path.relative_to(REPO).as_posix(), name) not in installed_on_purpose
    )
    assert wrong == []


def test_the_top_level_folders_are_namespaces_and_nanovllm_links_to_them() -> None:
    """The layout the tests above rely on, said plainly: no `__init__.py` at the top of the four
    folders, and nanovllm/kernels (viz, lessons) is a link to the folder at the top, so the
    checkout imports them by their installed names."""
    for name in FOLDERS:
        assert not (REPO / name / "__init__.py").exists(), name
    for name in ["kernels", "viz", "lessons"]:
        link = REPO / "nanovllm" / name
        assert link.is_symlink() and os.readlink(link) == f"../{name}", link
