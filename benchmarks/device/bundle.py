"""Build the wheels a GPU machine lacks into one archive: ``.device-bundle/site-cp312.tar.xz``.

    python benchmarks/device/bundle.py [--python 3.12] [--out .device-bundle] [--wheels DIR]

The GPU machines (docs/backends.md, "The pipeline on a GPU") have Python 3.12 with torch, transformers and the
scientific stack, no network, and no Ray, Prefect or their server's libraries. This script, run where PyPI answers:

1. ``pip download`` (wheels only, for CPython ``--python`` on manylinux x86-64) Ray, Prefect and the rest of
   certeval's runtime dependencies the machines lack, at the versions ``requirements.lock`` pins (a constraints
   file), with their whole dependency tree;
2. unpacks every wheel the machine lacks into ``site/``; a wheel of a package the machine already has goes into
   ``fallback/<name>/`` instead, with what the carried packages require of it written to ``manifest.json``:
   :mod:`benchmarks.device.unpack` adds a fallback on the machine only where its own version does not satisfy
   a requirement (the machine's torch and transformers keep their numpy, packaging, ...);
3. prunes what the pipeline cannot need: Ray's Java jars, dashboard web client, rllib / serve / tune / train /
   data / llm, every ``tests`` folder, the symbol tables of its three binaries; Prefect's web UI (the embedded
   server runs with its UI off);
4. adds ``model/``: SmolLM2's config and tokenizer, no weights (the benchmark builds random weights there);
5. writes one xz-compressed tar of ``manifest.json``, ``model/``, ``site/`` and ``fallback/``.

The archive must leave the repository and itself under the device's 64 MiB per call: it is refused above
``--max-mib`` (default 52).
"""

from __future__ import annotations

import argparse
import email.parser
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What the pipeline needs that the GPU image lacks (certeval's runtime dependencies, pyproject.toml); the image's
# own list is PRESENT below. s3fs is left out: only an s3:// bank or output needs it, and botocore is 13 MB.
WANTED = ("ray", "prefect", "sqlalchemy[asyncio]", "fastapi", "tenacity")
# The image's packages ('cuda', as the device docs list them): never unpacked into site/ (fallbacks only)
PRESENT = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite
lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
PRUNE = ("ray/jars", "ray/dashboard/client/build", "ray/rllib", "ray/serve", "ray/tune", "ray/train", "ray/data",
         "ray/llm", "ray/tests", "prefect/server/ui", "prefect/server/ui-v2")
STRIP = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(canonical name, version, Requires-Dist lines) read from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = email.parser.Parser().parsestr(zf.read(meta).decode("utf-8", "replace"))
    return canonical(msg["Name"]), msg["Version"], msg.get_all("Requires-Dist") or []


def requirements_on(wheels: list[Path], python: str, carried: set[str]) -> dict[str, list[str]]:
    """What the carried wheels require of each package (extras-free lines whose marker holds on the machine)."""
    from packaging.requirements import Requirement

    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "platform_python_implementation": "CPython",
           "implementation_name": "cpython", "os_name": "posix", "extra": ""}
    needs: dict[str, list[str]] = {}
    for wheel in wheels:
        name, _, lines = wheel_metadata(wheel)
        if name not in carried:
            continue
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            spec = str(req.specifier)
            needs.setdefault(canonical(req.name), [])
            if spec and f"{spec} ({name})" not in needs[canonical(req.name)]:
                needs[canonical(req.name)].append(f"{spec} ({name})")
    return needs


def extract(wheel: Path, target: Path) -> None:
    """Unzip a wheel keeping its files' modes (zipfile drops them: Ray's raylet and gcs_server must stay
    executable)."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, target))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                path.chmod(mode)


def download(dest: Path, python: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest),
           "-c", str(ROOT / "requirements.lock"), *WANTED]
    subprocess.run(cmd, check=True)


def prune(site: Path) -> int:
    removed = 0
    if shutil.which("strip"):  # symbol tables are a quarter of Ray's binaries; the dynamic symbols stay
        for rel in STRIP:
            path = site / rel
            if path.is_file():
                before = path.stat().st_size
                subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
                removed += before - path.stat().st_size
    for rel in PRUNE:
        path = site / rel
        if path.exists():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
    for path in sorted(site.rglob("tests"), reverse=True):
        if path.is_dir() and path.parent.name != "site":
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
    for path in site.rglob("*.js.map"):
        removed += path.stat().st_size
        path.unlink()
    return removed


def copy_model_files(target: Path) -> None:
    """SmolLM2's config and tokenizer (no weights: 540 MB cannot travel): the GPU benchmark builds a model of that
    vocabulary with random weights (``benchmarks/gpu_pipeline.py --shape``)."""
    sys.path.insert(0, str(ROOT))
    from certeval.inputs.smollm import ensure_converted

    source = ensure_converted()
    target.mkdir(parents=True)
    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def build(out: Path, python: str, max_mib: float, wheels: Path | None, preset: int = 6) -> Path:
    stage = out / "stage"
    wheels_dir = wheels or Path(tempfile.mkdtemp(prefix="certeval-wheels-"))
    wheels_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    download(wheels_dir, python)
    wheels = sorted(wheels_dir.glob("*.whl"))
    seen: dict[str, str] = {}
    for wheel in wheels:
        name, version, _ = wheel_metadata(wheel)
        if name in seen and seen[name] != version:
            raise SystemExit(f"two versions of {name} downloaded ({seen[name]}, {version}): clear {wheels_dir}")
        seen[name] = version
    carried = {n for n in seen if n not in PRESENT}
    if stage.exists():
        shutil.rmtree(stage)
    for wheel in wheels:
        name, _, _ = wheel_metadata(wheel)
        target = stage / "site" if name in carried else stage / "fallback" / name
        extract(wheel, target)
    copy_model_files(stage / "model")
    needs = requirements_on(wheels, python, carried)
    pruned = prune(stage / "site")
    manifest = {
        "python": python, "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "carried": {n: seen[n] for n in sorted(carried)},
        "fallback": {n: seen[n] for n in sorted(set(seen) - carried)},
        "requirements_on_fallbacks": {n: needs.get(n, []) for n in sorted(set(seen) - carried)},
        "pruned": list(PRUNE) + ["*/tests", "*.js.map"],
    }
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    archive = out / f"site-cp{python.replace('.', '')}.tar.xz"
    parts = [p for p in ("manifest.json", "model", "site", "fallback") if (stage / p).exists()]
    if shutil.which("xz") and shutil.which("tar"):  # multi-threaded xz: Python's lzma uses one core
        subprocess.run(["tar", "-C", str(stage), "-I", f"xz -T0 -{preset}", "-cf", str(archive), *parts], check=True)
    else:
        with tarfile.open(archive, "w:xz", preset=preset) as tar:
            for part in parts:
                tar.add(stage / part, arcname=part)
    shutil.rmtree(stage)
    if wheels is None:
        shutil.rmtree(wheels_dir)
    mib = archive.stat().st_size / 2**20
    print(f"{archive}: {mib:.1f} MiB ({len(carried)} packages carried, {len(seen) - len(carried)} fallbacks, "
          f"{pruned / 2**20:.0f} MiB pruned) in {time.perf_counter() - t0:.0f} s")
    if mib > max_mib:
        archive.unlink()
        raise SystemExit(f"the archive is {mib:.1f} MiB, over --max-mib {max_mib:g}: prune more")
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--out", default=str(ROOT / ".device-bundle"), help="output folder (git-ignored)")
    parser.add_argument("--max-mib", type=float, default=52.0)
    parser.add_argument("--wheels", default=None, help="download into (and keep) this folder (default: a temporary one)")
    parser.add_argument("--preset", type=int, default=6, choices=range(10), help="xz preset (0 fast ... 9 small)")
    args = parser.parse_args(argv)
    build(Path(args.out), args.python, args.max_mib, Path(args.wheels) if args.wheels else None, args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
