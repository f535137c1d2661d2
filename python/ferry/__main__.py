"""``python3 -m ferry``: the Python side of the ``ferry`` command.

    python3 -m ferry info [--json]   what an engine started here reports
    python3 -m ferry --version       the version

``info`` mirrors the C++ command ``ferry info`` (tools/ferry/info.cc) with
what the extension exposes. It starts an engine with the settings from the
environment (FERRY_*) on 127.0.0.1 at any free port, prints what it reports
and stops it: version, wire versions, transports (preferred first),
features, the metadata setting and every effective option grouped by what
reads it, with its variable and range. Then what only Python knows: the
interpreter, where the package and its extension were imported from, and
where the drop-ins ``nixl`` and ``mooncake.engine`` are imported from (and
whether each is Ferry's). The transport registry's details,
the metadata backends built in, libfabric's providers, the CUDA driver and
the limits are printed by the C++ command only (``ferry info``, tools/).
``--json`` prints one JSON object with the C++ command's keys for the part
both have ("version", "wire_versions", "transports", "features",
"options", "option_table", "peer_id_of_this_probe") and "python".
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

from . import _ferry
from ._engine import Engine, option_table

INFO_HELP = ("Starts an engine on 127.0.0.1 (any free port) with the settings from the "
             "environment (FERRY_*), prints what it reports (version, transports, features, "
             "wire versions, every effective option) and where the package and the drop-ins "
             "nixl and mooncake.engine are imported from, and stops it.")
USAGE_EPILOG = ("The transport registry, metadata backends, libfabric providers, CUDA "
                "driver and limits: the C++ command `ferry info` (tools/).")


def redact_metadata_url(url: str) -> str:
    """The URL with its password (scheme://user:PASSWORD@host) as ***, as
    ferry::RedactMetadataUrl shows it."""
    scheme = url.find("://")
    if scheme < 0:
        return url
    start = scheme + 3
    ends = [i for i in (url.find(c, start) for c in "/?#") if i >= 0]
    end = min(ends) if ends else len(url)
    at = url.rfind("@", start, end)
    if at < 0:
        return url
    colon = url.find(":", start)
    if colon < 0 or colon > at:  # a user, no password
        return url
    return url[:colon + 1] + "***" + url[at:]


def _in_unit(row: dict, value):
    """An option's value as the table states it: durations (seconds in
    Python) back in the row's unit, ms or us."""
    if row["type"] == "seconds":
        return round(value * (1e3 if row["unit"] == "ms" else 1e6))
    if row["name"] == "metadata":
        return redact_metadata_url(value)
    return value


def _json_key(row: dict) -> str:
    """The key of an option in --json's "options" (the C++ command's):
    durations carry their unit ("transfer_timeout_ms", "spin_us")."""
    return row["name"] + ("_" + row["unit"] if row["type"] == "seconds" else "")


def _is_ferrys_mooncake(engine_module) -> bool:
    from . import mooncake
    return getattr(engine_module, "TransferEngine", None) is mooncake.TransferEngine


def _is_ferrys_nixl(nixl_module) -> bool:
    import ferry
    return getattr(sys.modules.get("nixl._agent"), "ferry", None) is ferry  # python/nixl/_agent.py


# Whether a drop-in module, once imported, is Ferry's (not NVIDIA's or Mooncake's own).
_IS_FERRYS = {"mooncake.engine": _is_ferrys_mooncake, "nixl": _is_ferrys_nixl}


def _dropin(module: str, distribution: str) -> dict:
    """Where ``module`` is imported from (None: it cannot be, with why) and
    the version of ``distribution``."""
    info = {"module": module, "distribution": distribution, "version": None,
            "origin": None, "error": None, "ferry": None}
    try:
        info["version"] = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        imported = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 -- reported, not raised: a drop-in is optional
        info["error"] = f"{type(e).__name__}: {e}"
        return info
    info["origin"] = getattr(imported, "__file__", None)
    info["ferry"] = _IS_FERRYS[module](imported)
    return info


def gather() -> dict:
    """What ``info`` prints, from an engine started for the purpose."""
    table = option_table()
    with Engine() as engine:
        caps = engine.capabilities
        options = engine.options
        peer_id = engine.peer_id
        rpc_port = engine.rpc_port
    nixl = _dropin("nixl", "nixl")
    mooncake = _dropin("mooncake.engine", "mooncake-transfer-engine")
    return {
        "version": _ferry.version(),
        "wire_versions": {"min": caps["wire_version_min"], "max": caps["wire_version_max"]},
        "this_build_wire_versions": {"min": _ferry.WIRE_VERSION_MIN,
                                     "max": _ferry.WIRE_VERSION_MAX},
        "transports": caps["transports"],
        "features": caps["features"],
        "options": {_json_key(row): _in_unit(row, options[row["name"]]) for row in table},
        # Durations' default and value in the row's unit, as the C++ command gives them.
        "option_table": [dict(row, default=_in_unit(row, row["default"]),
                              value=_in_unit(row, options[row["name"]])) for row in table],
        "peer_id_of_this_probe": peer_id,
        "rpc_port_of_this_probe": rpc_port,
        "python": {
            "executable": sys.executable,
            "version": sys.version.split()[0],
            "package": str(Path(__file__).resolve().parent),
            "extension": _ferry.__file__,
            "dropins": {"nixl": nixl, "mooncake": mooncake},
        },
    }


def _pad(text: str, width: int) -> str:
    return text + " " * max(width - len(text), 1)


def _group_heading(group: str) -> str:
    if group == "engine":
        return "engine"
    if group == "metadata":
        return "metadata store"
    return ("transports " if "," in group else "transport ") + group


def format_text(info: dict) -> str:
    wire, built = info["wire_versions"], info["this_build_wire_versions"]
    table = info["option_table"]
    metadata = info["options"]["metadata"]
    lines = [
        f"ferry {info['version']}",
        f"wire versions      {wire['min']}..{wire['max']} "
        f"(this build: {built['min']}..{built['max']})",
        f"transports         {', '.join(info['transports'])}   (preferred first)",
        f"features           {', '.join(info['features'])}",
        f"metadata           {metadata}",
        "",
        "effective options (defaults overlaid with FERRY_* from the environment), "
        "by what reads them:",
        "  " + _pad("option", 30) + _pad("value", 16) + _pad("variable", 28) + "range",
    ]
    groups = list(dict.fromkeys(row["belongs_to"] for row in table))  # first-seen order
    for group in groups:
        lines.append("  " + _group_heading(group) + ":")
        for row in table:
            if row["belongs_to"] != group:
                continue
            value = str(row["value"]) if row["value"] != "" else "(empty)"
            if row["unit"]:
                value += " " + row["unit"]
            lines.append("    " + _pad(row["name"], 28) + _pad(value, 16)
                         + _pad(row["variable"] or "-", 28) + row["range"])
    lines.append(f"  [this probe's rpc port: {info['rpc_port_of_this_probe']}]")
    py = info["python"]
    lines += ["", f"python             {py['executable']} {py['version']}",
              f"  package          {py['package']}",
              f"  extension        {py['extension']}"]
    for d in py["dropins"].values():
        if d["origin"] is None:
            where = f"cannot be imported: {d['error']}"
        else:
            version = d["version"] or "no distribution metadata"
            owner = "Ferry's" if d["ferry"] else "NOT Ferry's"
            where = f"{owner}, {d['origin']} ({d['distribution']} {version})"
        lines.append(f"  {_pad(d['module'], 17)}{where}")
    lines += ["", USAGE_EPILOG]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ferry", description="Ferry's Python package.", epilog=USAGE_EPILOG)
    parser.add_argument("--version", action="version", version=f"ferry {_ferry.version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = commands.add_parser(
        "info", help="start an engine with the FERRY_* settings and print what it reports",
        description=INFO_HELP, epilog=USAGE_EPILOG)
    info.add_argument("--json", action="store_true", help="one JSON object")
    info.add_argument("--version", action="store_true", help="print only the version")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.version:
        print(f"ferry {_ferry.version()}")
        return 0
    try:
        data = gather()
    except Exception as e:  # noqa: BLE001 -- the one message the command prints
        print(f"python3 -m ferry info: cannot start an engine to ask it: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data))
    else:
        sys.stdout.write(format_text(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
