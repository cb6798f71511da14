"""The package list (everything else is in pyproject.toml).

`kernels/`, `viz/` and `lessons/` live at the top of the repository (the project's design card)
and install inside nanovllm, as `nanovllm.kernels`, `nanovllm.viz` and `nanovllm.lessons`.
`nanovllm/kernels` (and `viz`, `lessons`) is a link to the folder at the top, so the checkout has
the installed layout: setuptools copies the files through the link into the wheel, and an
editable install or a run from the checkout imports them by their installed names.

The three folders have no `__init__.py`: they are namespace packages (PEP 420). From the
repository's root, Python sees `kernels/` as at most a namespace portion named `kernels`, and
any installed package of that name (Hugging Face's `kernels`, which transformers imports) wins
over it (README, "The top-level folders").
"""

from setuptools import find_packages, setup

LINKED = ["kernels", "viz", "lessons"]  # nanovllm/<name> -> ../<name>

packages = ["nanovllm"] + [f"nanovllm.{sub}" for sub in find_packages("nanovllm")]
for name in LINKED:
    # Through the link (an sdist holds the files at nanovllm/<name>/ and no folder at the top).
    subpackages = find_packages(f"nanovllm/{name}")
    packages += [f"nanovllm.{name}"] + [f"nanovllm.{name}.{sub}" for sub in subpackages]

setup(packages=packages)
