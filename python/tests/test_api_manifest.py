"""Every public name of upstream NIXL and Mooncake exists in Ferry's drop-ins.

The names come from python/manifests/*.json: data read from upstream's sources
at a pinned commit (tools/gen_api_manifest.py wrote them; each file names the
version and commit). One test per name, so a failure says exactly which name
is missing or different:

* the name exists and is the right kind (module, constant, enum and each of
  its members, exception class, class and each of its methods/properties,
  function);
* for functions and methods: the same parameter names in the same order, of
  the same kind, with the same defaults (inspect.signature). Ours may add
  trailing keyword-only parameters with defaults. One equivalence is accepted:
  None where upstream's default is an empty list or dict (the usual way to
  avoid a mutable default);
* for pybind11 methods with several overloads: every overload's call binds
  (positionally, and by keyword where upstream declares py::arg names);
  without py::arg (upstream takes positional arguments only): the arity.

Extra names beyond upstream are allowed. `mooncake.engine` is Ferry's
ferry.mooncake, made importable by ferry.mooncake.install().
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import json
import logging
import sys
from pathlib import Path

import pytest

import ferry  # noqa: F401  (conftest put the build tree on sys.path)

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
EMPTY = inspect.Parameter.empty
PLACEHOLDER = object()


def _cases():
    for path in sorted(MANIFESTS.glob("*.json")):
        manifest = json.loads(path.read_text())
        for module, names in manifest["modules"].items():
            for name, entry in names.items():
                yield pytest.param(module, name, None, entry, id=f"{module}.{name}")
                if entry["kind"] == "class":
                    for member, sub in entry["members"].items():
                        yield pytest.param(module, name, member, sub,
                                           id=f"{module}.{name}.{member}")
                elif entry["kind"] == "enum":
                    for member in entry["members"]:
                        yield pytest.param(module, name, member, {"kind": "enum_value"},
                                           id=f"{module}.{name}.{member}")


def _manifest_entry(dotted: str) -> dict:
    """The manifest entry of "module.name" (for nixl's re-exports)."""
    module, name = dotted.rsplit(".", 1)
    for path in MANIFESTS.glob("*.json"):
        names = json.loads(path.read_text())["modules"].get(module)
        if names and name in names:
            return names[name]
    raise KeyError(dotted)


@pytest.fixture(scope="module", autouse=True)
def mooncake_installed():
    import ferry.mooncake as mc
    mc.install()
    yield
    mc.uninstall()


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.fail(f"module {name} cannot be imported: {e!r}")


# Instances to look for instance attributes (and properties set in __init__) on.
PROBES = {
    "nixl._api.nixl_agent_config": lambda m: m.nixl_agent_config(),
    "nixl._api.nixl_agent": lambda m: m.nixl_agent("ferry-api-manifest-probe"),
    "nixl._bindings.nixlAgentConfig": lambda m: m.nixlAgentConfig(),
    "nixl._bindings.nixlXferTelemetry": lambda m: m.nixlXferTelemetry(),
    "mooncake.engine.TransferNotify": lambda m: m.TransferNotify(),
}
_probes: dict[str, object] = {}


def _probe(module, qualname: str):
    if qualname not in _probes:
        _probes[qualname] = PROBES[qualname](module)
    return _probes[qualname]


# ---- kinds ---------------------------------------------------------------------------------

def check_kind(value, entry: dict, where: str, module) -> None:
    kind = entry["kind"]
    if kind == "module":
        assert inspect.ismodule(value), f"{where} is {value!r}, not a module"
    elif kind == "reexport":
        check_kind(value, _manifest_entry(entry["of"]), where, module)
    elif kind == "constant":
        assert not (inspect.isclass(value) or inspect.isroutine(value)
                    or inspect.ismodule(value)), f"{where} is {value!r}, not a constant"
        if "type" in entry:
            expected = getattr(builtins, entry["type"])
            assert isinstance(value, expected), \
                f"{where} is {value!r} ({type(value).__name__}), upstream's is a {entry['type']}"
        if "value" in entry:
            assert value == entry["value"], f"{where} is {value!r}, upstream's is {entry['value']!r}"
    elif kind == "attribute":
        if entry.get("type") == "logging.Logger":
            assert isinstance(value, logging.Logger), f"{where} is {value!r}, not a Logger"
    elif kind == "alias":
        if hasattr(builtins, entry["of"]):
            assert value is getattr(builtins, entry["of"]), \
                f"{where} is {value!r}, upstream's is {entry['of']}"
        else:
            assert value is getattr(module, entry["of"]), \
                f"{where} is not the same object as {entry['of']}"
    elif kind == "exception":
        assert inspect.isclass(value) and issubclass(value, BaseException), \
            f"{where} is {value!r}, not an exception class"
        base = getattr(builtins, entry.get("base", "Exception"))
        assert issubclass(value, base), f"{where} does not derive from {base.__name__}"
    elif kind in ("class", "enum"):
        assert inspect.isclass(value), f"{where} is {value!r}, not a class"
    elif kind == "enum_member":
        enum = getattr(module, entry["enum"], None)
        assert enum is not None, f"{where} exists but its enum {entry['enum']} does not"
        assert hasattr(enum, where.rsplit(".", 1)[1]), \
            f"{entry['enum']} has no member {where.rsplit('.', 1)[1]}"
        assert value == getattr(enum, where.rsplit(".", 1)[1]), \
            f"{where} is {value!r}, not {entry['enum']}.{where.rsplit('.', 1)[1]}"
    elif kind == "function":
        assert callable(value) and not inspect.isclass(value), f"{where} is {value!r}, not a function"
        check_signature(inspect.signature(value), entry, where, module)
    else:
        raise AssertionError(f"manifest kind {kind!r} of {where} is unknown to this test")


def check_member(module, cls, qualname: str, member: str, entry: dict) -> None:
    where = f"{qualname}.{member}"
    kind = entry["kind"]
    if kind == "enum_value":
        assert hasattr(cls, member), f"{where} does not exist"
        return
    if kind == "pickle":
        # Instances with a __dict__ pickle by default; otherwise a pickle method is needed.
        hooks = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__")
        defined = any(h in vars(k) for k in cls.__mro__[:-1] for h in hooks)
        assert "__dict__" in dir(cls) or defined, \
            f"{qualname} instances cannot be pickled (upstream's can)"
        return
    if kind in ("property", "instance_attribute"):
        if hasattr(cls, member):
            return
        if qualname in PROBES:
            assert hasattr(_probe(module, qualname), member), f"{where} does not exist"
            return
        init = getattr(cls.__init__, "__code__", None)
        assert init is not None and member in init.co_names, f"{where} does not exist"
        return
    if kind == "class_attribute":
        assert hasattr(cls, member), f"{where} does not exist"
        assert getattr(cls, member) is getattr(module, entry["same_as"]), \
            f"{where} is not {entry['same_as']}"
        return
    assert kind in ("method", "staticmethod", "classmethod"), f"unknown manifest kind {kind!r}"
    if member == "__init__":
        sig = inspect.signature(cls)
    else:
        assert member in dir(cls), f"{where} does not exist"
        value = getattr(cls, member)
        assert callable(value), f"{where} is {value!r}, not callable"
        static = inspect.getattr_static(cls, member)
        try:
            sig = inspect.signature(value)
        except (TypeError, ValueError):
            return  # a builtin slot (e.g. object.__eq__): exists, takes its arity
        if kind == "staticmethod":
            assert isinstance(static, staticmethod), f"{where} is not a staticmethod"
        elif not isinstance(static, (staticmethod, classmethod)):
            params = list(sig.parameters.values())
            if params and params[0].kind != inspect.Parameter.VAR_POSITIONAL:
                sig = sig.replace(parameters=params[1:])  # self
    check_signature(sig, entry, where, module)


# ---- signatures ----------------------------------------------------------------------------

def _default(expr: str, module):
    try:
        return eval(expr, dict(vars(module)))  # noqa: S307 -- manifest data, e.g. "[]", "DEFAULT_COMM_PORT"
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"upstream's default {expr!r} does not evaluate in {module.__name__}: "
                             f"{e!r}")


def _same_default(ours, expected) -> bool:
    if ours is None and expected in ([], {}) and type(expected) in (list, dict):
        return True
    return type(ours) is type(expected) and ours == expected


def check_params(sig: inspect.Signature, upstream: list[dict], where: str, module) -> None:
    """Same names, order, kinds and defaults; ours may add keyword-only params with defaults."""
    ours = list(sig.parameters.values())
    shown = f"ours: {where}{sig}"
    for i, up in enumerate(upstream):
        assert i < len(ours), f"{where} lacks parameter {up['name']!r} ({shown})"
        o = ours[i]
        assert o.name == up["name"], \
            f"{where} parameter {i + 1} is {o.name!r}, upstream's is {up['name']!r} ({shown})"
        assert o.kind.name.lower() == up["kind"], \
            f"{where} parameter {o.name!r} is {o.kind.name.lower()}, upstream's is {up['kind']} ({shown})"
        if "default" in up:
            assert o.default is not EMPTY, \
                f"{where} parameter {o.name!r} has no default, upstream's is {up['default']} ({shown})"
            expected = _default(up["default"], module)
            assert _same_default(o.default, expected), \
                f"{where} parameter {o.name!r} defaults to {o.default!r}, upstream's to {up['default']} ({shown})"
        elif up["kind"] not in ("var_positional", "var_keyword"):
            assert o.default is EMPTY, \
                f"{where} parameter {o.name!r} has a default ({o.default!r}), upstream's has none ({shown})"
    for o in ours[len(upstream):]:
        assert o.kind == inspect.Parameter.KEYWORD_ONLY and o.default is not EMPTY, \
            f"{where} has an extra parameter {o.name!r} that is not keyword-only with a default ({shown})"


def check_binds(sig: inspect.Signature, overload: dict, where: str) -> None:
    """One pybind overload's calls bind to our signature."""
    shown = f"ours: {where}{sig}"
    if "arity" in overload:
        n = overload["arity"]
        try:
            sig.bind(*[PLACEHOLDER] * n)
        except TypeError as e:
            raise AssertionError(f"{where} does not take {n} positional arguments: {e} ({shown})")
        return
    params = overload["params"]
    required = [p["name"] for p in params if "default" not in p]
    calls = {
        "all positionally": ([PLACEHOLDER] * len(params), {}),
        "the required ones positionally": ([PLACEHOLDER] * len(required), {}),
        "all by keyword": ([], {p["name"]: PLACEHOLDER for p in params}),
    }
    for how, (args, kwargs) in calls.items():
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            names = ", ".join(p["name"] for p in params)
            raise AssertionError(f"{where} does not accept ({names}) {how}: {e} ({shown})")


def check_signature(sig: inspect.Signature, entry: dict, where: str, module) -> None:
    if "params" in entry:
        check_params(sig, entry["params"], where, module)
        return
    overloads = entry.get("overloads", [])
    if len(overloads) == 1 and "params" in overloads[0]:
        check_params(sig, overloads[0]["params"], where, module)
        return
    for overload in overloads:
        check_binds(sig, overload, where)


# ---- the test ------------------------------------------------------------------------------

@pytest.mark.parametrize("module_name, name, member, entry", list(_cases()))
def test_upstream_name(module_name, name, member, entry):
    module = _module(module_name)
    qualname = f"{module_name}.{name}"
    assert hasattr(module, name), f"{qualname} does not exist"
    value = getattr(module, name)
    if member is None:
        check_kind(value, entry, qualname, module)
        return
    assert inspect.isclass(value), f"{qualname} is {value!r}, not a class"
    check_member(module, value, qualname, member, entry)


def test_manifests_name_their_upstream_commit():
    for path in MANIFESTS.glob("*.json"):
        manifest = json.loads(path.read_text())
        assert manifest["version"] and len(manifest["commit"]) == 40, path
    assert sys.modules.get("mooncake.engine") is not None  # installed by the fixture
