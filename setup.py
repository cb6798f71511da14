"""The package list, found by setuptools (everything else is in pyproject.toml).

`kernels/`, `viz/` and `lessons/` live at the top of the repository (the project's design card)
but install *inside* nanovllm, as `nanovllm.kernels`, `nanovllm.viz` and `nanovllm.lessons`: a
top-level `kernels` package would shadow Hugging Face's `kernels`, which transformers probes for.
`[tool.setuptools.packages.find]` names packages after their folders, so it cannot say that;
this finds each root's subpackages and names them under the root's package.
"""

from setuptools import find_packages, setup

ROOTS = {
    "nanovllm": "nanovllm",
    "nanovllm.kernels": "kernels",
    "nanovllm.viz": "viz",
    "nanovllm.lessons": "lessons",
}

packages = []
for package, folder in ROOTS.items():
    packages += [package] + [f"{package}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=ROOTS)
