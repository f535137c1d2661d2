"""Builds the `ferry` distribution by driving the project's CMake.

    /usr/bin/python3 -m pip install --no-build-isolation .

The pure-Python modules, py.typed and the extension's stub (_ferry.pyi) come
from python/ferry/; the extension ferry._ferry is the CMake target
ferry_python, built for the interpreter running this script
(-DPython_EXECUTABLE=sys.executable) and copied into the wheel.

By default a Release build of the extension only (no tests, tools or
examples) is configured under build/python-wheel/ (ignored by git; kept, so
a second install rebuilds only what changed). Environment:

  FERRY_CMAKE_BUILD_DIR       an existing, configured CMake build tree of this
                              checkout: build the target ferry_python there and
                              take the extension from it (no second compile;
                              it must have been configured for this Python)
  FERRY_CMAKE_ARGS            extra arguments for the configure step (shell words,
                              e.g. "-DCMAKE_CXX_COMPILER=clang++")
  CMAKE_BUILD_PARALLEL_LEVEL  parallel build jobs (CMake's own variable)

What the build needs besides setuptools, wheel and pip: CMake, a C++20
compiler, pybind11 and the libraries the core links (scripts/install-deps.sh
installs all of them as Debian packages).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REPO = Path(__file__).resolve().parent
# setuptools' own build products (and the default CMake tree) go under the
# git-ignored build*/ folders, not next to the sources.
BUILD_BASE = Path("build") / "python-wheel"
# The CMake target that builds the extension, and where it puts it in the tree.
CMAKE_TARGET = "ferry_python"
BUILT_PACKAGE = Path("python") / "ferry"


def ferry_version() -> str:
    """The project's version: CMakeLists.txt's project(ferry VERSION x.y.z)."""
    text = (REPO / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*ferry\s+VERSION\s+([0-9][0-9A-Za-z.]*)", text)
    if match is None:
        raise RuntimeError(f"no 'project(ferry VERSION ...)' in {REPO / 'CMakeLists.txt'}")
    return match.group(1)


class CMakeBuild(build_ext):
    """Builds ferry._ferry with CMake instead of compiling it here."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = self._build_tree()
        command = ["cmake", "--build", str(build_dir), "--target", CMAKE_TARGET]
        if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
            command += ["--parallel", str(os.cpu_count() or 1)]
        self._run(command)
        built = self._built_extension(build_dir)
        self._check_self_contained(built)
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)

    def _build_tree(self) -> Path:
        existing = os.environ.get("FERRY_CMAKE_BUILD_DIR")
        if existing:
            build_dir = Path(existing).resolve()
            if not (build_dir / "CMakeCache.txt").is_file():
                raise RuntimeError(f"FERRY_CMAKE_BUILD_DIR={existing}: no CMakeCache.txt there; "
                                   "configure it first (cmake -B DIR) or unset the variable")
            return build_dir
        build_dir = (REPO / self.build_temp / "cmake").resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        command = [
            "cmake", "-S", str(REPO), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DFERRY_BUILD_PYTHON=ON",
            "-DFERRY_BUILD_TESTS=OFF",
            "-DFERRY_BUILD_TOOLS=OFF",
            "-DFERRY_BUILD_EXAMPLES=OFF",
        ]
        cache = build_dir / "CMakeCache.txt"
        if not cache.is_file() and shutil.which("ninja"):  # the generator is fixed at first configure
            command += ["-G", "Ninja"]
        if shutil.which("ccache"):
            command += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        command += shlex.split(os.environ.get("FERRY_CMAKE_ARGS", ""))
        self._run(command)
        return build_dir

    @staticmethod
    def _built_extension(build_dir: Path) -> Path:
        """The extension CMake built, checked to be for this interpreter."""
        package = build_dir / BUILT_PACKAGE
        wanted = package / ("_ferry" + sysconfig.get_config_var("EXT_SUFFIX"))
        if wanted.is_file():
            return wanted
        found = sorted(p.name for p in package.glob("_ferry*.so")) if package.is_dir() else []
        if found:
            raise RuntimeError(
                f"{package} holds {', '.join(found)}, built for another Python than "
                f"{sys.executable} (which needs {wanted.name}); reconfigure that tree with "
                f"-DPython_EXECUTABLE={sys.executable} or unset FERRY_CMAKE_BUILD_DIR")
        raise RuntimeError(f"the build of target {CMAKE_TARGET} left no {wanted.name} in {package} "
                           "(is FERRY_BUILD_PYTHON off in that tree?)")

    @staticmethod
    def _check_self_contained(extension: Path) -> None:
        """Refuses an extension that needs Ferry's shared library: the wheel
        carries the module alone (today it links the static core)."""
        readelf = shutil.which("readelf")
        if readelf is None:
            return
        dynamic = subprocess.run([readelf, "-d", str(extension)], capture_output=True,
                                 text=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
        ferry_libs = [lib for lib in needed if lib.startswith("libferry")]
        if ferry_libs:
            raise RuntimeError(f"{extension} needs {', '.join(ferry_libs)}, which the wheel "
                               "does not carry: link ferry_python against the static library")

    @staticmethod
    def _run(command: list[str]) -> None:
        print("ferry setup.py:", shlex.join(command), flush=True)
        try:
            subprocess.run(command, cwd=REPO, check=True)
        except FileNotFoundError:
            raise RuntimeError(f"{command[0]} not found: install CMake (scripts/install-deps.sh)")
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"{shlex.join(command)} failed with exit status {e.returncode} "
                               "(its output is above)") from None


(REPO / BUILD_BASE).mkdir(parents=True, exist_ok=True)
setup(
    version=ferry_version(),
    packages=["ferry"],
    package_dir={"ferry": "python/ferry"},
    package_data={"ferry": ["py.typed", "*.pyi"]},
    exclude_package_data={"ferry": ["*.cc"]},
    ext_modules=[Extension("ferry._ferry", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": str(BUILD_BASE)},
             "egg_info": {"egg_base": str(BUILD_BASE)}},
    zip_safe=False,
)
