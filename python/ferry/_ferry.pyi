"""Type stub of ferry._ferry, the pybind11 layer (python/ferry/_ferry.cc).

Not a public API: use the `ferry` package. Handles (segments, batches,
prepared lists and transfers) are plain ints; every call that fails raises
the matching ferry.FerryError subclass. python/tests/test_pip_install.py
checks that this stub names exactly what the built module has.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ._errors import FerryError

_Buffer = Any  # any object with the buffer protocol (bytes, bytearray, numpy array, memoryview)
# A prepared transfer's notification: None, or (name, message).
_Notification = Optional[Tuple[str, Union[str, bytes, bytearray, memoryview]]]

WIRE_VERSION_MIN: int
WIRE_VERSION_MAX: int

def version() -> str: ...
def buffer_address(obj: _Buffer, writable: bool = True) -> Tuple[int, int]:
    """(address, nbytes) of a C- or F-contiguous buffer; raises BufferError."""
def remap_private(addr: int, length: int, fd: int) -> None:
    """Maps [addr, addr + length) again, in place, as a private copy-on-write
    mapping of ``fd`` from offset 0 (a forked child's managed-buffer arenas);
    raises OSError."""
def copy_from_buffer(dest: int, src: _Buffer, length: int) -> None:
    """memcpy(dest, src, length) from Python memory into raw memory."""
def read_bytes(source: int, length: int) -> bytes:
    """``length`` bytes copied from raw memory at ``source``."""
def option_table() -> List[Dict[str, Any]]:
    """Every engine option: name, belongs_to, type, default, variable, unit,
    range, min, max, meaning."""

class EngineOptions:
    """ferry::EngineOptions: one property per row of option_table() (int, str,
    or a float of seconds for durations) and the test-only settings."""

    def __init__(self) -> None: ...
    def with_environment(self) -> "EngineOptions":
        """A copy with FERRY_* environment variables overlaid."""
    def set(self, name: str, value: Any) -> None:
        """Sets the option ``name`` (a row of option_table()) to ``value``."""
    # The rows of ferry::OptionTable() (src/common/option_table.cc).
    local_name: str
    listen_host: str
    listen_port: int
    metadata: str
    metadata_ttl: float
    metadata_cluster: str
    transport: str
    fabric_provider: str
    fabric_nics: str
    secret_file: str
    metrics_address: str
    connect_timeout: float
    transfer_timeout: float
    handshake_timeout: float
    tcp_streams: int
    io_threads: int
    slice_size: int
    max_frame_bytes: int
    max_frame_entries: int
    tcp_send_buffer: int
    peer_max_requests: int
    peer_max_bytes: int
    max_handshakes_per_source: int
    max_connections_per_source: int
    notify_inbox_bytes: int
    spin: float
    wait_spin: float
    await_spin: float
    raise_fd_limit: int
    idle_link_timeout: float
    max_peer_links: int
    file_queue_depth: int
    map_shared_memory: int
    shm_rings: int
    # Test-only (ferry/testing_options.h).
    testing_wire_version_min: int
    testing_wire_version_max: int
    testing_cuda_driver: str

class NativeEngine:
    """One ferry::Engine; safe to use from several threads."""

    def __init__(self, options: EngineOptions) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def peer_id(self) -> str: ...
    @property
    def local_name(self) -> str: ...
    @property
    def rpc_port(self) -> int: ...
    def capabilities(self) -> Dict[str, Any]:
        """version, wire_version_min, wire_version_max, transports, features."""
    def options(self) -> EngineOptions: ...
    # Memory
    def register_memory(self, addr: int, length: int, location: str = "*",
                        exported: bool = True, fd: int = -1, fd_offset: int = 0) -> None: ...
    def allocate_shared(self, length: int, location: str = "cpu",
                        exported: bool = True) -> int: ...
    def free_shared(self, addr: int) -> None: ...
    def register_memory_list(self, addrs: Sequence[int], lengths: Sequence[int],
                             locations: Sequence[str], exported: bool = True) -> None: ...
    def unregister_memory(self, arg0: int) -> None: ...
    def register_file(self, path: str, fd: int, offset: int, length: int, writable: bool,
                      durable: bool, direct: bool, exported: bool) -> int: ...
    # Segments
    def open_segment(self, arg0: str) -> int: ...
    def close_segment(self, arg0: int) -> None: ...
    def query_segment(self, arg0: int) -> Dict[str, Any]:
        """peer_id, engine_name, instance_id, wire_version, transport,
        capabilities, regions [(addr, length, location, kind)]."""
    def segment_peer_id(self, arg0: int) -> str: ...
    # Batches: opcodes and segments hold one element or one per request.
    def allocate_batch(self, arg0: int) -> int: ...
    def submit(self, arg0: int, arg1: Sequence[int], arg2: Sequence[int], arg3: Sequence[int],
               arg4: Sequence[int], arg5: Sequence[int]) -> None:
        """submit(batch, opcodes, segments, local addrs, remote addrs, lengths)."""
    def batch_status(self, batch: int,
                     wait_us: int = 1000) -> Tuple[int, int, int, int, Optional[FerryError]]:
        """(state, submitted, completed, failed, first error or None); a poll in a tight loop
        while work is pending yields, then waits up to wait_us on it (Engine::PollBatch)."""
    def submit_one(self, opcode: int, segment: int, local: int, remote: int, length: int,
                   spin: bool = False
                   ) -> Tuple[int, Optional[Tuple[int, int, Optional[FerryError], bool]]]:
        """A new batch holding one request, submitted (freed again if the submit fails);
        with spin, polled for the engine's await_spin first (Engine::SpinBatch). (id, entry):
        entry as check_batches gives it once the batch ended (and was freed), else None."""
    def spin_batch(self, id: int,
                   owned: bool) -> Optional[Tuple[int, int, Optional[FerryError], bool]]:
        """Engine::SpinBatch for the engine's await_spin, then check_batches' entry of this
        batch once it ended (freed if owned), else None."""
    def take_finished(self) -> Tuple[List[int], List[int], bool]:
        """([batch ids], [transfer handles], overflowed) finished since the previous call
        (Engine::TakeFinished); recorded once completion_fd was asked for."""
    def check_batches(self, ids: Sequence[int],
                      owned: Sequence[bool]) -> List[Tuple[int, int, Optional[FerryError], bool]]:
        """[(index, state, first error or None, freed)] of the batches no longer pending,
        reported at once; an owned one is freed once it ended (freed True: its id is spent)."""
    def transfer_statuses(self, arg0: int) -> List[Tuple[int, Optional[FerryError]]]: ...
    def wait_batch(self, arg0: int, arg1: float) -> None: ...
    def free_batch(self, arg0: int) -> None: ...
    def cancel_batch(self, arg0: int) -> None: ...
    def transfer_sync(self, arg0: Sequence[int], arg1: Sequence[int], arg2: Sequence[int],
                      arg3: Sequence[int], arg4: Sequence[int]) -> None:
        """transfer_sync(opcodes, segments, local addrs, remote addrs, lengths)."""
    # Bulk request columns: one opcode and segment; each column a 1-D integer
    # array or a sequence of ints, read in one pass (TypeError for a bad element).
    def transfer_sync_columns(self, opcode: int, segment: int, locals: Any, remotes: Any,
                              lengths: Any) -> None: ...
    def submit_columns(self, batch: int, opcode: int, segment: int, locals: Any, remotes: Any,
                       lengths: Any) -> None: ...
    # Notifications
    def send_notification(self, arg0: int, arg1: str, arg2: str) -> None: ...
    def get_notifications(self) -> List[Tuple[str, str, bytes]]:
        """[(sender, name, message)], oldest first."""
    # Prepared transfers
    def prepare_list(self, rows: Any, segment: Optional[int] = None) -> Tuple[int, int]:
        """(handle, entries) of rows (an integer array or a sequence of rows)."""
    def desc_list_entries(self, arg0: int) -> int: ...
    def release_desc_list(self, arg0: int) -> None: ...
    def make_transfer(self, opcode: int, local: int, local_indices: Any, remote: int,
                      remote_indices: Any, notification: _Notification = None) -> int: ...
    def post_transfer(self, transfer: int, notification: _Notification = None) -> None: ...
    def transfer_state(self, transfer: int,
                       wait_us: int = 1000) -> Tuple[int, Optional[FerryError]]: ...
    def spin_transfer(self, transfer: int) -> Tuple[int, Optional[FerryError]]:
        """(state, error or None) after Engine::SpinTransfer for the engine's await_spin."""
    def wait_transfer(self, arg0: int, arg1: float) -> None: ...
    def transfer_telemetry(self, arg0: int) -> Tuple[int, int, int, int, int]:
        """(start_us, post_us, transfer_us, bytes, entries)."""
    def cancel_transfer(self, arg0: int) -> None: ...
    def release_transfer(self, arg0: int) -> None: ...
    # Agent metadata
    def export_metadata(self) -> bytes: ...
    def import_metadata(self, arg0: _Buffer) -> int: ...
    # Telemetry
    def metrics(self) -> Dict[str, Any]:
        """routes, transfer_latency, counters."""
    def metrics_text(self) -> str: ...
    def metrics_address(self) -> str: ...
    def completion_fd(self, dup: bool = False) -> int:
        """The engine's completion eventfd (Engine::CompletionFd; armed by this call); with
        dup=True a duplicate the caller owns and closes."""
