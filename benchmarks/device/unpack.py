"""Unpack ``benchmarks/device/bundle.py``'s archive on a GPU machine; add a fallback only where it is needed.

    python3 benchmarks/device/unpack.py ARCHIVE DEST

Writes ``DEST/site`` (put it on ``PYTHONPATH``) and ``DEST/model`` (config and tokenizer). Each ``fallback/<name>``
of the archive is a package the machine's image already has: it is copied into ``DEST/site`` only when the
machine's own version is missing or misses a requirement of the carried packages (``manifest.json``), so torch and
transformers keep the versions they were built with. Standard library and ``packaging`` (on every image) only.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path


def unmet(name: str, specs: list[str]) -> str | None:
    """Why the machine's own ``name`` does not do (None: it does)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
    for spec in specs:
        bare = spec.split(" (")[0]
        if not SpecifierSet(bare).contains(Version(have), prereleases=True):
            return f"{have} misses {spec}"
    return None


def unpack(archive: Path, dest: Path) -> list[str]:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(archive, "r:xz") as tar:
        if hasattr(tarfile, "tar_filter"):  # Python >= 3.12 (and 3.11.4): refuse links out of dest, keep modes
            tar.extractall(dest, filter="tar")
        else:
            tar.extractall(dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    added = []
    for name, specs in sorted(manifest["requirements_on_fallbacks"].items()):
        why = unmet(name, specs)
        if why is not None:
            shutil.copytree(dest / "fallback" / name, dest / "site", dirs_exist_ok=True)
            added.append(f"{name}=={manifest['fallback'][name]} ({why})")
    shutil.rmtree(dest / "fallback", ignore_errors=True)
    return added


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    archive, dest = Path(argv[0]), Path(argv[1])
    if not archive.is_file():
        print(f"no archive at {archive}: run python benchmarks/device/bundle.py first (where PyPI answers)",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    added = unpack(archive, dest)
    print(f"unpacked {archive} into {dest} in {time.perf_counter() - t0:.1f} s; fallbacks added: "
          f"{', '.join(added) or 'none (the machine has what the carried packages need)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
