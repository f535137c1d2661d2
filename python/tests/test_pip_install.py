"""`pip install` of the three distributions, checked from a fresh virtual
environment: `ferry` (the repository root: setup.py drives CMake), `nixl`
(python/dist/nixl) and `mooncake-transfer-engine` (python/dist/mooncake).

The environment is made with Debian's interpreter and its site packages
(numpy, torch, pytest, pip, setuptools, wheel): `python3 -m venv
--system-site-packages --without-pip`; pip installs offline (--no-index,
--no-build-isolation). To avoid a second compile, setup.py takes the extension
from the CMake build tree the tests' `ferry` was imported from (or
$FERRY_CMAKE_BUILD_DIR), building only the target ferry_python there (up to
date after the build the tests need). Everything then runs with the
environment's interpreter and no PYTHONPATH: the imports, `python3 -m ferry
info`, a Mooncake transfer between two processes that never call
ferry.mooncake.install(), and the drop-in suites (test_nixl.py,
test_mooncake.py, test_api_manifest.py) against the installed packages.

The stub test (the names of python/ferry/_ferry.pyi against the built
extension) needs no environment and runs in the quick tier.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ferry
from ferry import _ferry

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[1]
PIP_TIMEOUT = 600  # seconds; a no-op build of ferry_python plus three wheels
SUITE_TIMEOUT = 600
# The suites that must pass against the installed packages.
SUITES = ["test_nixl.py", "test_mooncake.py", "test_api_manifest.py"]
# (test_mooncake.py's install/uninstall case knows when a mooncake package is on disk.)
DESELECTED: list = []


def _source_version(path: Path, pattern: str) -> str:
    return re.search(pattern, path.read_text(), re.MULTILINE).group(1)


NIXL_VERSION = _source_version(REPO / "python" / "nixl" / "__init__.py",
                               r'^__version__ = "([^"]+)"')


def _cmake_build_dir() -> Path | None:
    """$FERRY_CMAKE_BUILD_DIR, else the CMake tree the imported ferry was built in."""
    if os.environ.get("FERRY_CMAKE_BUILD_DIR"):
        return Path(os.environ["FERRY_CMAKE_BUILD_DIR"])
    # <build>/python/ferry/_ferry*.so; not resolved: a link to another tree's module
    # (a private import root) must not make this test build in that tree.
    tree = Path(_ferry.__file__).absolute().parents[2]
    return tree if (tree / "CMakeCache.txt").is_file() else None


def _clean_env(**extra: str) -> dict:
    """The environment without the build tree on the path or user config."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "FERRY_PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONNOUSERSITE="1")
    env.update(extra)
    return env


def _run(command: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, command))} exited with {result.returncode}\n"
        f"--- stdout (last 4000 chars)\n{result.stdout[-4000:]}\n"
        f"--- stderr (last 4000 chars)\n{result.stderr[-4000:]}")
    return result


class Venv:
    def __init__(self, root: Path):
        self.root = root
        self.python = root / "bin" / "python3"
        self.site = Path(subprocess.run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip())

    def run(self, *args, timeout: float = 120, input: str | None = None,
            cwd: Path | None = None, **env) -> subprocess.CompletedProcess:
        return _run([self.python, *args], timeout, input=input, cwd=cwd or self.root,
                    env=_clean_env(**env))

    def popen(self, *args) -> subprocess.Popen:
        return subprocess.Popen([str(self.python), *map(str, args)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=self.root,
                                env=_clean_env())


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    build_dir = _cmake_build_dir()
    if build_dir is None:
        pytest.skip(f"ferry was imported from {Path(ferry.__file__).parent}, not a CMake build "
                    "tree: set FERRY_CMAKE_BUILD_DIR to one (a full wheel build takes too long "
                    "for a test)")
    root = tmp_path_factory.mktemp("pip") / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", root], 120)
    env = Venv(root)
    # pip itself comes from the system site packages (python3-pip).
    env.run("-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir",
            REPO, REPO / "python" / "dist" / "nixl", REPO / "python" / "dist" / "mooncake",
            timeout=PIP_TIMEOUT, cwd=REPO, FERRY_CMAKE_BUILD_DIR=str(build_dir))
    return env


@pytest.mark.multiprocess
def test_imports_come_from_the_environment_without_install(venv):
    script = textwrap.dedent("""
        import importlib.metadata as md, json, sys
        from mooncake.engine import TransferEngine   # no ferry.mooncake.install()
        import ferry, ferry.mooncake, mooncake, mooncake.engine, nixl, nixl._api
        print(json.dumps({
            "files": {m.__name__: m.__file__ for m in (ferry, ferry._ferry, nixl, nixl._api,
                                                       mooncake, mooncake.engine)},
            "finder_installed": ferry.mooncake._finder in sys.meta_path,
            "is_ferrys": TransferEngine is ferry.mooncake.TransferEngine,
            "same_objects": [n for n in ferry.mooncake._EXPORTS
                             if getattr(mooncake.engine, n, None) is getattr(ferry.mooncake, n)],
            "exports": ferry.mooncake._EXPORTS,
            "versions": {d: md.version(d) for d in ("ferry", "nixl", "mooncake-transfer-engine")},
            "package_versions": {"ferry": ferry.__version__, "nixl": nixl.__version__,
                                 "mooncake": ferry.mooncake.MOONCAKE_VERSION},
            "requires": {d: md.requires(d) for d in ("nixl", "mooncake-transfer-engine")},
        }))
    """)
    info = json.loads(venv.run("-c", script, cwd=REPO).stdout)
    for module, file in info["files"].items():
        assert Path(file).resolve().is_relative_to(venv.site.resolve()), \
            f"{module} was imported from {file}, not from {venv.site}"
    assert not info["finder_installed"] and info["is_ferrys"]
    assert info["same_objects"] == info["exports"], "mooncake.engine lacks some of ferry.mooncake's"
    manifest = json.loads((REPO / "python" / "manifests" / "mooncake.json").read_text())
    assert set(manifest["modules"]["mooncake.engine"]) <= set(info["exports"])
    versions, package = info["versions"], info["package_versions"]
    assert versions["ferry"] == package["ferry"] == ferry.__version__
    assert versions["nixl"] == package["nixl"] == NIXL_VERSION
    assert versions["mooncake-transfer-engine"] == package["mooncake"]
    for dist, requires in info["requires"].items():  # "ferry (==0.1.0)" or "ferry==0.1.0"
        assert f"ferry=={ferry.__version__}" in [re.sub(r"[ ()]", "", r) for r in requires], dist
    for typed in ("ferry/py.typed", "ferry/_ferry.pyi", "nixl/py.typed", "mooncake/py.typed"):
        assert (venv.site / typed).is_file(), f"{typed} was not installed"
    assert not (venv.site / "ferry" / "_ferry.cc").exists()


TARGET = """
import json, sys
from mooncake.engine import TransferEngine
engine = TransferEngine()
assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, engine.last_error()
addr = engine.allocate_managed_buffer(4096)
engine.write_bytes_to_buffer(addr, bytes(4096), 4096)
print(json.dumps({"name": f"127.0.0.1:{engine.get_rpc_port()}", "addr": addr,
                  "module": type(engine).__module__}), flush=True)
sys.stdin.readline()  # the initiator is done
print(engine.read_bytes_from_buffer(addr, 4096).hex(), flush=True)
"""

INITIATOR = """
import sys
from mooncake.engine import TransferEngine
name, remote = sys.argv[1], int(sys.argv[2])
engine = TransferEngine()
assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, engine.last_error()
local = engine.allocate_managed_buffer(4096)
engine.write_bytes_to_buffer(local, bytes(range(256)) * 16, 4096)
assert engine.transfer_sync_write(name, local, remote, 4096) == 0, engine.last_error()
print(type(engine).__module__)
"""


@pytest.mark.multiprocess
def test_mooncake_transfer_between_processes_without_install(venv):
    """Two processes (as Ray workers would be) only `from mooncake.engine import
    TransferEngine`: one writes into the other's managed buffer."""
    target = venv.popen("-c", TARGET)
    try:
        hello = json.loads(target.stdout.readline() or "{}")
        assert hello.get("module") == "ferry.mooncake", f"target said {hello}"
        result = venv.run("-c", INITIATOR, hello["name"], str(hello["addr"]))
        assert result.stdout.strip() == "ferry.mooncake"
        out, _ = target.communicate("done\n", timeout=120)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait(timeout=120)
    assert target.returncode == 0
    assert bytes.fromhex(out.strip()) == bytes(range(256)) * 16


@pytest.mark.multiprocess
def test_python_m_ferry_info(venv):
    text = venv.run("-m", "ferry", "info").stdout
    assert text.startswith(f"ferry {ferry.__version__}\n")
    for heading in ("transports", "features", "effective options", "transfer_timeout"):
        assert heading in text
    info = json.loads(venv.run("-m", "ferry", "info", "--json").stdout)
    assert info["version"] == ferry.__version__
    assert info["transports"] and "tcp" in info["transports"]
    assert [row["name"] for row in info["option_table"]] == \
        [row["name"] for row in ferry.option_table()]
    assert info["options"]["transfer_timeout_ms"] == 30000  # the default, in the table's unit
    assert Path(info["python"]["package"]).is_relative_to(venv.site.resolve())
    dropins = info["python"]["dropins"]
    assert dropins["nixl"]["ferry"] and dropins["nixl"]["version"] == NIXL_VERSION
    assert dropins["mooncake"]["ferry"] and dropins["mooncake"]["origin"].startswith(str(venv.site))
    assert venv.run("-m", "ferry", "--version").stdout == f"ferry {ferry.__version__}\n"


@pytest.mark.multiprocess
def test_dropin_suites_pass_against_the_installed_packages(venv):
    """conftest imports ferry from $FERRY_PYTHONPATH: the environment's site packages."""
    command = ["-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES]
    for test in DESELECTED:
        command += ["--deselect", test]
    result = venv.run(*command, timeout=SUITE_TIMEOUT, cwd=TESTS,
                      FERRY_PYTHONPATH=str(venv.site))
    assert re.search(r"\d+ passed", result.stdout) and " failed" not in result.stdout


# ---- The stub of the extension ---------------------------------------------------------

def _stub_names(node) -> set[str]:
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    return names


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stub_names_what_the_extension_has():
    stub = ast.parse((TESTS.parent / "ferry" / "_ferry.pyi").read_text())
    classes = {c.name: c for c in stub.body if isinstance(c, ast.ClassDef)}
    module_names = {n for n in _stub_names(stub) if not n.startswith("_")}
    assert module_names == _public(_ferry)
    for name, node in classes.items():
        assert _stub_names(node) - {"__init__"} == _public(getattr(_ferry, name)), name
