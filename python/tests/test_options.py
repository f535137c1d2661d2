"""Engine options from Python: every row of the C++ option table (the one
`ferry info` prints) is a keyword of ferry.Engine, set through ferry::SetOption.

The tests iterate ferry.option_table(), so a row added to the table is
covered here as soon as it exists; one that Python cannot take fails.
"""

from __future__ import annotations

import pytest

import ferry
from ferry import _ferry

ROWS = ferry.option_table()
NAMES = [row["name"] for row in ROWS]
# What Engine::Create fills in when left at its default.
RESOLVED = {"local_name", "io_threads"}


def python_value(row: dict, in_unit: int):
    """A value of the row's unit as ferry.Engine takes it (durations in seconds)."""
    if row["type"] == "seconds":
        return in_unit / (1e3 if row["unit"] == "ms" else 1e6)
    return in_unit


def other_value(row: dict):
    """A valid value of the row that is not its default."""
    if row["type"] == "str":
        return "a-value" if row["default"] != "a-value" else "another"
    bound = row["max"] if python_value(row, row["max"]) != row["default"] else row["min"]
    return python_value(row, bound)


def test_the_table_names_every_option_once_with_what_it_belongs_to():
    assert len(NAMES) == len(set(NAMES))
    # The options the hand-written bindings lacked, and the identity ones.
    for name in ("fabric_provider", "fabric_nics", "peer_max_requests", "peer_max_bytes",
                 "max_handshakes_per_source", "max_connections_per_source",
                 "notify_inbox_bytes", "local_name", "listen_host", "listen_port"):
        assert name in NAMES
    for row in ROWS:
        assert row["type"] in ("int", "str", "seconds"), row
        # "engine", "metadata" or transports (option_table_test checks them against the registry).
        assert row["belongs_to"], row
        assert (row["min"] is None) == (row["type"] == "str"), row
    by_name = {row["name"]: row for row in ROWS}
    assert by_name["tcp_streams"]["belongs_to"] == "shm, tcp"
    assert by_name["transfer_timeout"]["type"] == "seconds"
    assert by_name["transfer_timeout"]["default"] == 30.0
    assert by_name["slice_size"]["default"] == 1 << 20


@pytest.mark.parametrize("row", ROWS, ids=NAMES)
def test_every_row_is_settable_from_python(row):
    # The setter ferry.Engine uses for its keywords, on the native options.
    options = _ferry.EngineOptions()
    assert getattr(options, row["name"]) == row["default"]
    value = other_value(row)
    options.set(row["name"], value)
    assert getattr(options, row["name"]) == value
    options.set(row["name"], row["default"])
    assert getattr(options, row["name"]) == row["default"]


def test_every_row_is_an_engine_keyword():
    defaults = {row["name"]: row["default"] for row in ROWS}
    with ferry.Engine(environment=False, **defaults) as e:
        options = e.options
        assert set(NAMES) <= set(options)
        for name in NAMES:
            if name not in RESOLVED:
                assert options[name] == defaults[name], name
        assert options["local_name"] == e.peer_id
        assert options["io_threads"] == min(defaults["tcp_streams"], 4)


def test_options_the_bindings_lacked_reach_the_engine():
    given = dict(fabric_provider="tcp", peer_max_requests=100, peer_max_bytes=1 << 20,
                 max_handshakes_per_source=8, max_connections_per_source=16,
                 notify_inbox_bytes=1 << 16, listen_host="127.0.0.1")
    # fabric_provider="tcp": the fabric transport on libfabric's tcp provider where this
    # build has libfabric; an engine without it leaves the transport out and starts.
    with ferry.Engine(environment=False, **given) as e:
        for name, value in given.items():
            assert e.options[name] == value, name


def test_an_unknown_keyword_names_the_closest_options():
    with pytest.raises(TypeError, match=r'unknown option "fabric_provder" '
                                        r"\(did you mean fabric_provider\?\)"):
        ferry.Engine(fabric_provder="tcp")
    with pytest.raises(TypeError, match="the options are local_name, listen_host"):
        ferry.Engine(carrier_pigeons=2)
    with pytest.raises(TypeError, match="unknown option"):
        _ferry.EngineOptions().set("no_such_option", 1)


def test_values_of_the_wrong_type_or_outside_the_range_are_refused():
    with pytest.raises(TypeError, match="option tcp_streams takes int, got str"):
        ferry.Engine(tcp_streams="4")
    with pytest.raises(TypeError, match="option transport takes str, got int"):
        ferry.Engine(transport=1)
    with pytest.raises(TypeError, match=r"option spin takes seconds \(a number\), got str"):
        ferry.Engine(spin="50us")
    with pytest.raises(ferry.InvalidArgument, match=r"tcp_streams must be in \[1, 64\], got 0"):
        ferry.Engine(tcp_streams=0)
    with pytest.raises(ferry.InvalidArgument,
                       match=r"transfer_timeout must be in \[1, 86400000\] ms, got 0"):
        ferry.Engine(transfer_timeout=0)
    with pytest.raises(ferry.InvalidArgument,
                       match=r"listen_port must be 0 \(any free port\) or in \[1, 65535\], "
                             r"got 65536"):
        ferry.Engine(listen_port=65536)
    # The property setters take the same path.
    options = _ferry.EngineOptions()
    with pytest.raises(ferry.InvalidArgument, match="peer_max_bytes must be in"):
        options.peer_max_bytes = 1
    assert options.peer_max_bytes == _ferry.EngineOptions().peer_max_bytes


def test_durations_are_seconds_in_the_unit_of_the_row():
    options = _ferry.EngineOptions()
    options.set("connect_timeout", 0.0015)  # ms: rounded up
    assert options.connect_timeout == 0.002
    options.set("wait_spin", 0.0000014)  # us: to the nearest
    assert options.wait_spin == pytest.approx(0.000001)
    options.set("spin", -1)  # not positive: 0, which spin allows
    assert options.spin == 0.0
