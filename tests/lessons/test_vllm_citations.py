"""Every claim a lesson makes about vLLM points at vLLM's source, and only at files we checked.

A lesson's "In vLLM itself" section cites files as `vllm/...py`, then the function or class the
claim rests on: "`vllm/v1/core/block_pool.py`, `BlockPool.get_new_blocks`". The oracle is
`vllm_sources.json`, the vLLM files that were read, all in one released version (its "version"),
with the names found in each. So a lesson that talks about vLLM without a citation fails, and so
does a cited path or name that is not on the list: a typo, or a file nobody read. CI has no vLLM,
so the list itself is re-checked against an installed vLLM by `check_vllm_sources.py`, by hand.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `check_vllm_sources`
import check_vllm_sources  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*"))
SOURCE_LIST = json.loads((Path(__file__).with_name("vllm_sources.json")).read_text())
SOURCES = SOURCE_LIST["files"]
VERSION = SOURCE_LIST["version"]

MENTIONS_VLLM = re.compile(r"\bvLLM\b")  # "nanovllm" is lowercase and one word: never matches
CITED_PATH = re.compile(r"`(vllm/[\w/]+\.py)`")  # `nanovllm/...` has no backtick before `vllm/`
# A path, then the function or class it is cited for: "`vllm/x.py`, `Name`" or "`Cls.method`".
CITATION = re.compile(r"`(vllm/[\w/]+\.py)`,\s*`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)`")
METHOD = re.compile(r"`([A-Z]\w*\.[A-Za-z_]\w*)`")  # `Class.method`, wherever it stands


def texts(lesson: Path) -> dict[str, str]:
    return {
        f.name: f.read_text() for f in (lesson / "README.md", lesson / "hints.md") if f.exists()
    }


def test_there_are_eighteen_lessons():
    assert len(LESSONS) == 18, [lesson.name for lesson in LESSONS]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_a_lesson_that_mentions_vllm_cites_a_file_and_a_name(lesson):
    readme = (lesson / "README.md").read_text()
    if MENTIONS_VLLM.search(readme):
        assert CITATION.search(readme), (
            f"{lesson.name}/README.md talks about vLLM but cites no `vllm/...py`, `Name`"
        )


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_every_cited_path_and_name_was_checked(lesson):
    for name, text in texts(lesson).items():
        for path in CITED_PATH.findall(text):
            assert path in SOURCES, f"{lesson.name}/{name} cites `{path}`: not in vllm_sources.json"
        for path, symbol in CITATION.findall(text):
            assert symbol in SOURCES[path]["names"], (
                f"{lesson.name}/{name} cites `{path}`, `{symbol}`: not a name checked in that file"
            )


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_every_method_named_in_the_vllm_section_was_checked(lesson):
    """`Class.method` in "In vLLM itself", even away from its path, is a name checked somewhere."""
    readme = (lesson / "README.md").read_text()
    section = readme.partition("## In vLLM itself")[2].split("\n## ", 1)[0]
    checked = {name for entry in SOURCES.values() for name in entry["names"]}
    for method in METHOD.findall(section):
        assert method in checked, f"{lesson.name}/README.md names `{method}`: not checked in vLLM"


def test_the_source_list_is_one_version_every_file_read_and_holds_only_cited_files():
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION
    cited = {p for lesson in LESSONS for t in texts(lesson).values() for p in CITED_PATH.findall(t)}
    for path, entry in SOURCES.items():
        assert entry["how"] == "read", path
        assert entry["names"], path
        assert "commit" not in entry, f"{path}: one version for all files, not a commit per file"
    assert set(SOURCES) == cited, set(SOURCES) ^ cited


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_the_vllm_section_says_which_vllm_it_was_checked_against(lesson):
    readme = (lesson / "README.md").read_text()
    if "## In vLLM itself" in readme:
        section = readme.partition("## In vLLM itself")[2].split("\n## ", 1)[0]
        assert f"*Checked against vLLM {VERSION} " in section, (
            f"{lesson.name}/README.md: the closing note does not say vLLM {VERSION}"
        )


def test_the_recheck_script_finds_top_level_and_class_level_names():
    tree = ast.parse(
        "import a.b as c\nfrom d import e\nX: int = 1\nY = 2\ndef f(): pass\n"
        "class K:\n    z = 3\n    def m(self): pass\n    class N: pass\n"
    )
    names = check_vllm_sources.defined_names(tree)
    assert names == {"c", "e", "X", "Y", "f", "K", "K.z", "K.m", "K.N"}, names


def test_the_lesson_14_gather_claim_is_the_v1_one():
    """vLLM v1 all-gathers the logits on every platform (Platform.use_all_gather is True)."""
    readme = (ROOT / "lessons" / "14_tensor_parallelism" / "README.md").read_text()
    assert "`vllm/platforms/interface.py`, `Platform.use_all_gather`" in readme
    assert "not an all-gather, except" not in readme  # the old, V0 claim
