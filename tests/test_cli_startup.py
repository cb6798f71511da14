"""The command line starts without torch: `import nanovllm` and the dispatch are lazy.

Each check runs in a fresh interpreter (a subprocess), since this test process has torch
loaded already. What is checked is `sys.modules`, not a time: a timing assertion would be
flaky on a shared machine, and importing torch is what made `nanovllm --help` slow.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import importlib.machinery, json, sys, types

def heavy():
    return sorted(m for m in ("torch", "transformers", "textual", "fastapi") if m in sys.modules)

report = {}
import nanovllm
report["import nanovllm"] = heavy()
report["dir"] = "LLM" in dir(nanovllm) and "SamplingParams" in dir(nanovllm)

from nanovllm import cli

def run(argv):
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code

run(["--help"])
report["nanovllm --help"] = heavy()
run(["serve", "--help"])
report["nanovllm serve --help"] = heavy()

# A stand-in subcommand records what was loaded when the dispatch handed over to it.
fake = types.ModuleType("nanovllm_fake_subcommand")
fake.__spec__ = importlib.machinery.ModuleSpec(fake.__name__, None)
seen = {}
fake.add_arguments = lambda parser: seen.setdefault("add_arguments", heavy())
fake.run = lambda args: seen.setdefault("run", heavy()) and 0
sys.modules[fake.__name__] = fake
cli.SUBCOMMANDS["fake"] = (fake.__name__, "a stand-in")
report["exit code"] = run(["fake"])
report["handed over"] = seen

try:
    nanovllm.no_such_name
except AttributeError as exc:
    report["unknown name"] = str(exc)

from nanovllm import LLM, SamplingParams, TokensPrompt
report["after from nanovllm import LLM"] = heavy()
report["names"] = [LLM.__module__, SamplingParams.__module__, TokensPrompt.__module__]
print(json.dumps(report))
"""


def test_import_and_help_load_no_torch():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["import nanovllm"] == []
    assert report["dir"] is True
    assert report["nanovllm --help"] == []
    assert report["nanovllm serve --help"] == []
    assert report["handed over"] == {"add_arguments": [], "run": []}
    assert report["exit code"] == 0
    assert "no_such_name" in report["unknown name"]
    # The lazy names still resolve, and this is what does load torch (so the probe can see it).
    assert "torch" in report["after from nanovllm import LLM"]
    assert report["names"] == ["nanovllm.engine.llm", "nanovllm.sampling_params", "nanovllm.inputs"]
