"""The `mooncake-transfer-engine` distribution: the package mooncake/ here
(see pyproject.toml)."""

import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BUILD_BASE = REPO / "build" / "python-wheel" / "dist-mooncake"  # git-ignored, not next to the sources


def read_version(path: Path, pattern: str) -> str:
    match = re.search(pattern, path.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{path}: no match for {pattern!r}")
    return match.group(1)


BUILD_BASE.mkdir(parents=True, exist_ok=True)
setup(
    # The Mooncake API version ferry.mooncake reproduces (what install() reports too).
    version=read_version(REPO / "python" / "ferry" / "mooncake.py",
                         r'^MOONCAKE_VERSION = "([^"]+)"'),
    install_requires=[
        "ferry==" + read_version(REPO / "CMakeLists.txt", r"project\(\s*ferry\s+VERSION\s+(\S+)"),
    ],
    packages=["mooncake"],
    package_data={"mooncake": ["py.typed"]},
    options={"build": {"build_base": str(BUILD_BASE)},
             "egg_info": {"egg_base": str(BUILD_BASE)}},
    zip_safe=False,
)
