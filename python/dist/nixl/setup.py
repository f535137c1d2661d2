"""The `nixl` distribution: the package python/nixl (see pyproject.toml)."""

import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SOURCE = HERE.parents[1] / "nixl"  # python/nixl
BUILD_BASE = REPO / "build" / "python-wheel" / "dist-nixl"  # git-ignored, not next to the sources


def read_version(path: Path, pattern: str) -> str:
    match = re.search(pattern, path.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{path}: no match for {pattern!r}")
    return match.group(1)


BUILD_BASE.mkdir(parents=True, exist_ok=True)
setup(
    # The NIXL API version implemented, as the package states it.
    version=read_version(SOURCE / "__init__.py", r'^__version__ = "([^"]+)"'),
    install_requires=[
        "ferry==" + read_version(REPO / "CMakeLists.txt", r"project\(\s*ferry\s+VERSION\s+(\S+)"),
        "numpy",
    ],
    packages=["nixl"],
    package_dir={"nixl": "../../nixl"},
    package_data={"nixl": ["py.typed"]},
    options={"build": {"build_base": str(BUILD_BASE)},
             "egg_info": {"egg_base": str(BUILD_BASE)}},
    zip_safe=False,
)
