"""Build llama.cpp for the bench's `llamacpp` engine, from the `llama-cpp-python` source package.

    python -m nanovllm.bench.tools.build_llamacpp [--build-dir /tmp/llamacpp] [--jobs N]
        [--no-amx] [--target llama-batched-bench]

`llama-cpp-python`'s sdist vendors llama.cpp under `vendor/llama.cpp`, so one PyPI download pins
the exact llama.cpp a Python user of it gets. The build follows llama.cpp's docs for a CPU
(docs/build.md, "CPU Build"): CMake, Release, `GGML_NATIVE` (the compiler's `-march=native`, so
the CPU's own SIMD is used), no GPU backend. Nothing is fetched at build or run time: no HTTPS
client (`LLAMA_OPENSSL=OFF`; the curl option is gone from this llama.cpp), no prebuilt web UI.
Only the targets the bench runs are built (a full build is several times longer on 2 cores):

    llama-server         the engine: an HTTP server with continuous batching (`--parallel N`)
    llama-batched-bench  llama.cpp's own throughput tool, for uniform prompt/output lengths

`--target` builds one of them (and the libraries it links) instead of both.

`--no-amx` builds for this CPU's instruction sets but without AMX: `GGML_NATIVE` off and each
x86 extension /proc/cpuinfo lists turned on by its own GGML option. On the team's 2-core VM
(Xeon, `amx_tile`/`amx_int8` listed), a native build crashed in `ggml_backend_amx_mul_mat` on
the first `llama_decode` of SmolLM2's Q4_1 file.

The binaries and libraries land in `<build-dir>/build/bin/`; the bench finds them there
(`$LLAMACPP_BIN_DIR` overrides).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

TARGETS = ("llama-server", "llama-batched-bench")

# llama.cpp's CPU build with native flags; every option that could reach the network is off.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


# /proc/cpuinfo flag -> the GGML option that compiles for it (x86), for --no-amx
X86_OPTIONS = {
    "sse4_2": "GGML_SSE42", "f16c": "GGML_F16C", "fma": "GGML_FMA", "bmi2": "GGML_BMI2",
    "avx": "GGML_AVX", "avx2": "GGML_AVX2", "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16",
}  # fmt: skip


def without_amx(cpu_flags: set[str]) -> list[str]:
    """CMake options for these CPU flags' instruction sets, AMX off, instead of GGML_NATIVE."""
    options = [f"-D{X86_OPTIONS[f]}=ON" for f in X86_OPTIONS if f in cpu_flags]
    amx = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return ["-DGGML_NATIVE=OFF", *options, *amx]


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    raise RuntimeError("no flags line in /proc/cpuinfo")


def cmake_configure_command(source: Path, build: Path, no_amx: bool = False) -> list[str]:
    """The `cmake` configure command line (Ninja when installed, else CMake's default)."""
    generator = ["-G", "Ninja"] if _have("ninja") else []
    options = list(CMAKE_OPTIONS)
    if no_amx:
        options = [o for o in options if not o.startswith("-DGGML_NATIVE")] + without_amx(
            cpu_flags()
        )
    return ["cmake", "-S", str(source), "-B", str(build), *generator, *options]


def cmake_build_command(build: Path, jobs: int, targets: tuple[str, ...] = TARGETS) -> list[str]:
    """The `cmake --build` command line for `targets` only."""
    command = ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs)]
    for target in targets:
        command += ["--target", target]
    return command


def _have(program: str) -> bool:
    return any(
        (Path(d) / program).exists() for d in os.environ.get("PATH", "").split(os.pathsep) if d
    )


def fetch_sdist(into: Path, version: str | None) -> Path:
    """Download `llama-cpp-python`'s source package into `into` with pip; return its path."""
    into.mkdir(parents=True, exist_ok=True)
    spec = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", spec,
         "-d", str(into)],
        check=True,
    )  # fmt: skip
    sdists = sorted(into.glob("llama_cpp_python-*.tar.gz"), key=lambda p: p.stat().st_mtime)
    if not sdists:
        raise FileNotFoundError(f"pip left no llama_cpp_python-*.tar.gz in {into}")
    return sdists[-1]


def vendored_llamacpp(sdist: Path, into: Path) -> Path:
    """Unpack `sdist` into `into` (once) and return its `vendor/llama.cpp` folder."""
    name = sdist.name.removesuffix(".tar.gz")
    source = into / name / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").exists():
        # The "data" filter refuses links and paths out of `into` (Python >= 3.10.12).
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        with tarfile.open(sdist) as tar:
            tar.extractall(into, **safe)
    if not (source / "CMakeLists.txt").exists():
        raise FileNotFoundError(f"{sdist} has no vendor/llama.cpp/CMakeLists.txt")
    return source


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=Path("/tmp/llamacpp"))
    parser.add_argument("--sdist", type=Path, help="a downloaded llama_cpp_python-*.tar.gz")
    parser.add_argument("--version", help="llama-cpp-python version to download (default newest)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-amx", action="store_true", help="this CPU's x86 extensions, no AMX")
    parser.add_argument(
        "--target", action="append", choices=TARGETS, help="build only this one (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    root = args.build_dir.resolve()
    sdist = args.sdist or fetch_sdist(root, args.version)
    source = vendored_llamacpp(sdist, root)
    build = root / "build"
    start = time.perf_counter()
    subprocess.run(cmake_configure_command(source, build, args.no_amx), check=True)
    targets = tuple(args.target or TARGETS)
    subprocess.run(cmake_build_command(build, args.jobs, targets), check=True)
    print(f"built {', '.join(targets)} from {sdist.name} in {time.perf_counter() - start:.0f} s")
    for target in targets:
        print(f"  {build / 'bin' / target}")


if __name__ == "__main__":
    main()
