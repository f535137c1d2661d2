#!/usr/bin/env python3
"""Writes python/manifests/{nixl,mooncake}.json: the public Python names of
upstream NIXL and Mooncake, read from their sources at a pinned commit.

    /usr/bin/python3 tools/gen_api_manifest.py [--nixl GITDIR] [--mooncake GITDIR]

The manifests are data (facts about upstream, with the version and commit they
describe); python/tests/test_api_manifest.py checks Ferry's drop-ins against
them. This script reads upstream's files with `git show COMMIT:PATH` only.
Python modules are read with `ast`; pybind11 modules with a small parser of
their `PYBIND11_MODULE` bodies (m.attr, py::enum_, py::register_exception,
py::class_ with its .def chain, m.def). Parameters:

* Python functions: every parameter with its kind and default (source text).
* pybind functions with py::arg: the names and defaults (as Python source
  text); without py::arg: the arity (positional arguments only). Overloads are
  kept apart ("overloads": one entry per .def).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NIXL = {"version": "1.4.0", "commit": "8770b655a", "mirror": "/work/.mirror/ai-dynamo+nixl/repo"}
MOONCAKE = {"version": "0.3.12.post1", "commit": "3b5a59413",
            "mirror": "/work/.mirror/kvcache-ai+Mooncake/repo"}


def git_show(gitdir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", gitdir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def full_commit(gitdir: str, commit: str) -> str:
    return subprocess.run(["git", "-C", gitdir, "rev-parse", commit], check=True,
                          capture_output=True, text=True).stdout.strip()


# ---- Python sources ----------------------------------------------------------------------

def py_params(fn: ast.FunctionDef, drop_first: bool) -> list[dict]:
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        out.append(_param(arg.arg, kind, default))
    if a.vararg:
        out.append({"name": a.vararg.arg, "kind": "var_positional"})
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append(_param(arg.arg, "keyword_only", default))
    if a.kwarg:
        out.append({"name": a.kwarg.arg, "kind": "var_keyword"})
    return out[1:] if drop_first else out


def _param(name, kind, default):
    p = {"name": name, "kind": kind}
    if default is not None:
        p["default"] = ast.unparse(default)
    return p


def _is_public(name: str) -> bool:
    return not name.startswith("_")


def python_module(source: str) -> dict:
    """Public names a Python module defines itself (imported names are left out)."""
    tree = ast.parse(source)
    names: dict[str, dict] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _is_public(node.name):
            names[node.name] = {"kind": "function", "params": py_params(node, False)}
        elif isinstance(node, ast.ClassDef) and _is_public(node.name):
            names[node.name] = python_class(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and _is_public(t.id):
                    names[t.id] = _assigned(node.value)
    return names


def _assigned(value: ast.expr) -> dict:
    if isinstance(value, ast.Name) and value.id in ("int", "str", "bytes", "float"):
        return {"kind": "alias", "of": value.id}
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "get_logger":
        return {"kind": "attribute", "type": "logging.Logger"}
    entry = {"kind": "constant"}
    try:
        v = ast.literal_eval(value)
        entry["type"] = type(v).__name__
        if not isinstance(v, (dict, list)):
            entry["value"] = v
    except ValueError:
        entry["source"] = ast.unparse(value)
    return entry


def python_class(node: ast.ClassDef) -> dict:
    bases = [ast.unparse(b) for b in node.bases]
    if "Enum" in bases:
        members = [t.id for s in node.body if isinstance(s, ast.Assign)
                   for t in s.targets if isinstance(t, ast.Name)]
        return {"kind": "enum", "members": members}
    members: dict[str, dict] = {}
    attributes: list[str] = []
    for s in node.body:
        if not isinstance(s, ast.FunctionDef):
            continue
        decorators = [ast.unparse(d) for d in s.decorator_list]
        if s.name == "__init__":
            members["__init__"] = {"kind": "method", "params": py_params(s, True)}
            for sub in ast.walk(s):
                if (isinstance(sub, (ast.Assign, ast.AnnAssign))):
                    for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target]):
                        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                and t.value.id == "self" and _is_public(t.attr)
                                and t.attr not in attributes):
                            attributes.append(t.attr)
            continue
        if not _is_public(s.name):
            continue
        if "property" in decorators:
            members[s.name] = {"kind": "property"}
        elif "staticmethod" in decorators:
            members[s.name] = {"kind": "staticmethod", "params": py_params(s, False)}
        elif "classmethod" in decorators:
            members[s.name] = {"kind": "classmethod", "params": py_params(s, True)}
        else:
            members[s.name] = {"kind": "method", "params": py_params(s, True)}
    for a in attributes:
        members.setdefault(a, {"kind": "instance_attribute"})
    return {"kind": "class", "members": members}


# ---- pybind11 sources ----------------------------------------------------------------------

def strip_comments(src: str) -> str:
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
        elif src.startswith("/*", i):
            i = src.find("*/", i) + 2
        elif c in "\"'":
            j = i + 1
            while src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def keep_branch(src: str, defined: set[str]) -> str:
    """Resolves #ifdef/#else/#endif for the macros in `defined` (nesting handled)."""
    out, stack = [], []  # stack of "this branch is kept"
    for line in src.splitlines():
        s = line.strip()
        m = re.match(r"#\s*(ifdef|ifndef|if|else|endif|elif)\b\s*(.*)", s)
        if m:
            d, arg = m.groups()
            if d in ("ifdef", "ifndef", "if"):
                name = arg.split()[0] if arg else ""
                on = name in defined if d != "ifndef" else name not in defined
                if d == "if":
                    on = bool(re.search(r"defined\s*\(?\s*(\w+)", arg)) and \
                        re.search(r"defined\s*\(?\s*(\w+)", arg).group(1) in defined
                stack.append(on)
            elif d in ("else", "elif"):
                stack[-1] = not stack[-1]
            elif d == "endif":
                stack.pop()
            continue
        if all(stack):
            out.append(line)
    return "\n".join(out)


def split_top(s: str) -> list[str]:
    """Splits a C++ argument list at top-level commas (strings, (), [], {}, <> nested)."""
    parts, depth, cur, i = [], 0, [], 0
    angle = [0]
    while i < len(s):
        c = s[i]
        if c in "\"'":
            j = i + 1
            while s[j] != c:
                j += 2 if s[j] == "\\" else 1
            cur.append(s[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
            angle.append(0)
        elif c in ")]}":
            depth -= 1
            angle.pop()
        elif c == "<" and i > 0 and (s[i - 1].isalnum() or s[i - 1] in "_:"):
            angle[-1] += 1
        elif c == ">" and angle[-1] > 0 and s[i - 1] != "-":
            angle[-1] -= 1
        elif c == "," and depth == 0 and angle[-1] == 0:
            parts.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def matching(s: str, i: int) -> int:
    """Index of the bracket closing the one at s[i] (strings skipped)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [s[i]]
    j = i + 1
    while stack:
        c = s[j]
        if c in "\"'":
            k = j + 1
            while s[k] != c:
                k += 2 if s[k] == "\\" else 1
            j = k
        elif c in pairs:
            stack.append(c)
        elif c in ")]}":
            stack.pop()
        j += 1
    return j - 1


def cpp_params_count(param_list: str) -> int:
    p = param_list.strip()
    return 0 if p in ("", "void") else len(split_top(p))


def lambda_arity(callable_src: str) -> int:
    m = re.match(r"\[[^\]]*\]\s*\(", callable_src)
    open_ = m.end() - 1
    return cpp_params_count(callable_src[open_ + 1:matching(callable_src, open_)])


CPP_DEFAULTS = {"false": "False", "true": "True", "nullptr": "None", "std::string(\"\")": '""',
                '""': '""'}


def cpp_default(expr: str, constants: dict[str, str]) -> str:
    expr = expr.strip()
    if expr in CPP_DEFAULTS:
        return CPP_DEFAULTS[expr]
    if re.fullmatch(r"-?\d+", expr):
        return expr
    if re.fullmatch(r"std::vector<[\w:]+>\(\{\}\)", expr):
        return "[]"
    if re.fullmatch(r'"([^"\\]*)"', expr):
        return expr
    if expr in constants:
        return constants[expr]
    raise ValueError(f"no Python form known for the C++ default {expr!r}")


def py_args(extras: list[str], constants) -> list[dict] | None:
    params = []
    for e in extras:
        m = re.match(r'py::arg\("(\w+)"\)(?:\.noconvert\(\))?\s*(?:=\s*(.*))?$', e, re.S)
        if m:
            p = {"name": m.group(1), "kind": "positional_or_keyword"}
            if m.group(2) is not None:
                p["default"] = cpp_default(m.group(2), constants)
            params.append(p)
    return params or None


class PybindModule:
    """The names a PYBIND11_MODULE body declares, read from its source."""

    def __init__(self, src: str, arity_of):
        self.src = src
        self.arity_of = arity_of  # "&Class::method" or "&function" -> arity
        self.names: dict[str, dict] = {}

    def overload(self, callable_src: str, extras: list[str], constants, is_method: bool):
        params = py_args(extras, constants)
        if params is not None:
            return {"params": params}
        c = callable_src.strip()
        if c.startswith("["):
            n = lambda_arity(c) - (1 if is_method else 0)
        else:
            n = self.arity_of(c)
        return {"arity": n}

    def parse(self, body: str, constants: dict[str, str]):
        for m in re.finditer(r'm\.attr\("(\w+)"\)\s*=\s*([^;]+);', body):
            name, value = m.groups()
            value = value.strip()
            if value.startswith("m.attr("):
                self.names[name] = {"kind": "alias", "of": re.search(r'"(\w+)"', value).group(1)}
            elif value in ("true", "false"):
                self.names[name] = {"kind": "constant", "type": "bool"}
            else:
                self.names[name] = dict({"kind": "constant"}, **constants.get(("attr", value), {}))
        for m in re.finditer(r'py::register_exception<\w+>\(m,\s*"(\w+)"(\s*,[^)]*)?\)', body):
            self.names[m.group(1)] = {"kind": "exception", "base": "Exception"}
        for m in re.finditer(r'm\.def\(', body):
            args = split_top(body[m.end():matching(body, m.end() - 1)])
            name = args[0].strip('"')
            self.names.setdefault(name, {"kind": "function", "overloads": []})["overloads"].append(
                self.overload(args[1], args[2:], constants, is_method=False))
        for m in re.finditer(r'py::enum_<[^>]+>\s*(\w+)?\s*\(\s*m,\s*"(\w+)"', body):
            var, name = m.groups()
            start = m.end()
            chain = body[start:body.find(";", start)]
            if var:  # declared as a variable: its .value chain is the next statement
                nxt = body.find(var + ".value", start)
                chain += body[nxt:body.find(";", nxt)]
            members = re.findall(r'\.value\("(\w+)"', chain)
            self.names[name] = {"kind": "enum", "members": members}
            if ".export_values()" in chain:
                for member in members:
                    self.names[member] = {"kind": "enum_member", "enum": name}
        for m in re.finditer(r'py::class_<[^;]*?>\s*\(\s*m\s*,\s*"(\w+)"\s*\)', body):
            self.names[m.group(1)] = self.parse_class(body, m.end(), constants)

    def parse_class(self, body: str, pos: int, constants) -> dict:
        members: dict[str, dict] = {}
        end = body.find(";", pos)
        # the chain ends at the first ';' at bracket depth 0
        i = pos
        while True:
            c = body[i]
            if c in "([{":
                i = matching(body, i) + 1
                continue
            if c in "\"'":
                i = body.index(c, i + 1) + 1
                continue
            if c == ";":
                end = i
                break
            i += 1
        chain = body[pos:end]
        for m in re.finditer(r'\.(def|def_static|def_readwrite|def_readonly|def_property_readonly|'
                             r'def_property)\(', chain):
            kind = m.group(1)
            args = split_top(chain[m.end():matching(chain, m.end() - 1)])
            first = args[0]
            if kind in ("def_readwrite", "def_property"):
                members[first.strip('"')] = {"kind": "property", "writable": True}
            elif kind in ("def_readonly", "def_property_readonly"):
                members[first.strip('"')] = {"kind": "property", "writable": False}
            elif first.startswith("py::init"):
                tm = re.match(r"py::init<(.*)>\(\)$", first, re.S)
                if tm:
                    ov = py_args(args[1:], constants)
                    ov = {"params": ov} if ov else {"arity": cpp_params_count(tm.group(1))}
                else:  # py::init(lambda)
                    inner = first[first.index("(") + 1:-1]
                    ov = py_args(args[1:], constants)
                    ov = {"params": ov} if ov else {"arity": lambda_arity(inner)}
                members.setdefault("__init__", {"kind": "method", "overloads": []})[
                    "overloads"].append(ov)
            elif first == "py::self == py::self":
                members["__eq__"] = {"kind": "method", "overloads": [{"arity": 1}]}
            elif first.startswith("py::pickle("):
                members["__pickle__"] = {"kind": "pickle"}
            else:
                name = first.strip('"')
                k = "staticmethod" if kind == "def_static" else "method"
                members.setdefault(name, {"kind": k, "overloads": []})["overloads"].append(
                    self.overload(args[1], args[2:], constants, is_method=k == "method"))
        return {"kind": "class", "members": members}


def cpp_decl_arity(text: str, cls: str | None, name: str) -> int:
    """Arity of function `name` declared in `text` (inside `class cls` when given)."""
    if cls:
        m = re.search(r"\bclass\s+" + cls + r"\b[^;{]*\{", text)
        text = text[m.end() - 1:matching(text, m.end() - 1) + 1]
    m = re.search(r"\b" + name + r"\s*\(", text)
    if not m:
        raise ValueError(f"no declaration of {cls}::{name}")
    return cpp_params_count(text[m.end():matching(text, m.end() - 1)])


def pybind_module(src: str, module: str, arity_of, constants, defined=frozenset()) -> dict:
    src = keep_branch(strip_comments(src), set(defined))
    m = re.search(r"PYBIND11_MODULE\(\s*" + module + r"\s*,\s*m\s*\)\s*\{", src)
    body = src[m.end() - 1:matching(src, m.end() - 1) + 1]
    mod = PybindModule(src, arity_of)
    mod.parse(body, constants)
    return mod.names


# ---- NIXL -------------------------------------------------------------------------------

def nixl_manifest(gitdir: str) -> dict:
    c = NIXL["commit"]
    show = lambda p: git_show(gitdir, c, p)  # noqa: E731
    descriptors = strip_comments(show("src/api/cpp/nixl_descriptors.h"))
    agent_h = strip_comments(show("src/api/cpp/nixl.h"))
    utils_src = strip_comments(show("src/bindings/python/nixl_utils.cpp"))
    lists = {"nixl_xfer_dlist_t", "nixl_remote_dlist_t", "nixl_reg_dlist_t"}

    def arity_of(ref: str) -> int:
        m = re.fullmatch(r"&(?:(\w+)::)?(\w+)", ref)
        cls, name = m.groups()
        if cls in lists:
            return cpp_decl_arity(descriptors, "nixlDescList", name)
        if cls == "nixlAgent":
            return cpp_decl_arity(agent_h, "nixlAgent", name)
        if cls is None:
            return cpp_decl_arity(utils_src, None, r"(?<![\w.])" + name)
        raise ValueError(f"no header known for {ref}")

    types_h = show("src/api/cpp/nixl_types.h")
    port = re.search(r"default_comm_port\s*=\s*(\d+)", types_h + show("src/api/cpp/nixl.h"))
    init_agent = re.search(r'NIXL_INIT_AGENT\s+"([^"]*)"', types_h)
    constants = {}
    if port:
        constants[("attr", "default_comm_port")] = {"type": "int", "value": int(port.group(1))}
    if init_agent:
        constants[("attr", "NIXL_INIT_AGENT")] = {"type": "str", "value": init_agent.group(1)}

    modules = {
        "nixl._api": python_module(show("src/api/python/_api.py")),
        "nixl._bindings": pybind_module(show("src/bindings/python/nixl_bindings.cpp"),
                                        "_bindings", arity_of, constants),
        "nixl._utils": pybind_module(show("src/bindings/python/nixl_utils.cpp"), "_utils",
                                     arity_of, constants),
        "nixl.logging": python_module(show("src/api/python/logging.py")),
    }
    # `X = nixlBind.X` in _api.py: the same value as the binding's X.
    for name, entry in modules["nixl._api"].items():
        source = entry.get("source", "")
        if source.startswith("nixlBind.") and source[9:] in modules["nixl._bindings"]:
            modules["nixl._api"][name] = dict(modules["nixl._bindings"][source[9:]],
                                              same_as=f"nixl._bindings.{source[9:]}")
    # The wheel's nixl/__init__.py: the four submodules as attributes, then every public
    # name of each (in this order, a later one replacing an earlier one of the same name).
    top: dict[str, dict] = {}
    for sub in ("_api", "_bindings", "_utils", "logging"):
        top[sub] = {"kind": "module", "module": f"nixl.{sub}"}
    for sub in ("_api", "_bindings", "_utils", "logging"):
        for name in modules[f"nixl.{sub}"]:
            top[name] = {"kind": "reexport", "of": f"nixl.{sub}.{name}"}
    modules = {"nixl": top, **modules}
    return {
        "upstream": "NIXL", "package": "nixl", "version": NIXL["version"],
        "commit": full_commit(gitdir, c),
        "sources": ["src/bindings/python/nixl-meta/nixl/__init__.py", "src/api/python/_api.py",
                    "src/api/python/logging.py", "src/bindings/python/nixl_bindings.cpp",
                    "src/bindings/python/nixl_utils.cpp", "src/api/cpp/nixl.h",
                    "src/api/cpp/nixl_descriptors.h", "src/api/cpp/nixl_types.h"],
        "modules": modules,
        "excluded": {
            "imports": "names _api.py and logging.py only import (Optional, Union, Enum, np, "
                       "pickle, sys, os, logging, TYPE_CHECKING, nixlBind, torch, ...) are not "
                       "NIXL's API, although the wheel's nixl/__init__.py re-exports them too",
        },
    }


# ---- Mooncake -----------------------------------------------------------------------------

def mooncake_manifest(gitdir: str) -> dict:
    c = MOONCAKE["commit"]
    show = lambda p: git_show(gitdir, c, p)  # noqa: E731
    header = strip_comments(show("mooncake-integration/transfer_engine/transfer_engine_py.h"))
    location = show("mooncake-transfer-engine/include/memory_location.h")
    wildcard = re.search(r'kWildcardLocation\s*=\s*("[^"]*")', location).group(1)

    def arity_of(ref: str) -> int:
        m = re.fullmatch(r"&(\w+)::(\w+)", ref)
        if not m or m.group(1) != "TransferEnginePy":
            raise ValueError(f"no header known for {ref}")
        return cpp_decl_arity(header, "TransferEnginePy", m.group(2))

    src = show("mooncake-integration/transfer_engine/transfer_engine_py.cpp")
    names = pybind_module(src, "engine", arity_of, {"kWildcardLocation": wildcard},
                          defined={"USE_CUDA"})
    # adaptor_cls.attr("TransferOpcode") = transfer_opcode;
    if re.search(r'adaptor_cls\.attr\("TransferOpcode"\)', src):
        names["TransferEngine"]["members"]["TransferOpcode"] = {"kind": "class_attribute",
                                                                "same_as": "TransferOpcode"}
    excluded = {
        "RpcInterface": "Mooncake's RPC interface (bind_rpc_interface), not the transfer "
                        "engine: out of Ferry's scope",
        "CoroRPCInterface": "alias of RpcInterface: out of scope",
        "ReceivedData": "registered by bind_rpc_interface: out of scope",
        "ReceivedTensor": "registered by bind_rpc_interface: out of scope",
        "create_rpc_client": "registered by bind_rpc_interface: out of scope",
        "create_rpc_server": "registered by bind_rpc_interface: out of scope",
        "SharedSegment": "mooncake::bind_shared_segment (shared_segment_py.cpp): cross-process "
                         "shared memory segments, a separate facility from the transfer engine; "
                         "not parsed here",
        "mooncake.store": "Mooncake Store (MooncakeDistributedStore, ...): out of Ferry's scope",
    }
    return {
        "upstream": "Mooncake", "package": "mooncake-transfer-engine",
        "version": MOONCAKE["version"], "commit": full_commit(gitdir, c),
        "build": "CUDA (USE_CUDA defined; USE_EFA, USE_HIP, USE_MNNVL, USE_MUSA, "
                 "USE_INTRA_NVLINK, USE_TENT not defined)",
        "sources": ["mooncake-integration/transfer_engine/transfer_engine_py.cpp",
                    "mooncake-integration/transfer_engine/transfer_engine_py.h",
                    "mooncake-transfer-engine/include/memory_location.h"],
        "modules": {"mooncake.engine": names},
        "excluded": excluded,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nixl", default=NIXL["mirror"], help="NIXL git directory")
    ap.add_argument("--mooncake", default=MOONCAKE["mirror"], help="Mooncake git directory")
    ap.add_argument("--out", default=str(ROOT / "python" / "manifests"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, manifest in (("nixl", nixl_manifest(args.nixl)),
                           ("mooncake", mooncake_manifest(args.mooncake))):
        manifest = {"generated_by": "tools/gen_api_manifest.py", **manifest}
        path = out / f"{name}.json"
        path.write_text(json.dumps(manifest, indent=1) + "\n")
        count = sum(len(v) for v in manifest["modules"].values())
        print(f"{path}: {count} module-level names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
