/* Ferry's C API: the engine from C (C11) or any language with a C FFI.
 *
 * Conventions (docs/c-api.md says more):
 *
 * Handles. ferry_options_t, ferry_engine_t, ferry_segment_info_t and
 * ferry_notifications_t are opaque objects made by a *_new / query / drain
 * call and freed by the matching *_free / *_destroy call. Segments, batches,
 * prepared lists and prepared transfers are uint64_t values the engine
 * checks on every use (a stale or made-up one is FERRY_INVALID_ARGUMENT or
 * FERRY_NOT_FOUND, never a crash); a valid one is never 0, so 0 can mean
 * "none". Only C types cross this boundary: integers, pointers and structs
 * of them.
 *
 * Status. Every function returns a ferry_status_t (an int): FERRY_OK, or one
 * of the codes below, which are those of ferry::StatusCode (ferry/status.h)
 * with the same numbers and meanings. A null handle or a null pointer where
 * one is required is FERRY_INVALID_ARGUMENT. The exceptions are the few
 * functions that return a const char* and cannot fail: ferry_last_error,
 * ferry_status_name and ferry_version.
 *
 * Errors. ferry_last_error() is per thread: the message of the last call
 * this thread made that returned something other than FERRY_OK, naming what
 * was wrong. A call that returns FERRY_OK clears it to "", except the
 * queries that report a failure (ferry_batch_status, ferry_batch_spin,
 * ferry_batch_request_status, ferry_xfer_status, ferry_xfer_spin): they
 * return FERRY_OK (the query worked) and leave the failure's message there.
 * The pointer stays valid until this thread's next call into this API.
 *
 * Strings out. A const char* out-parameter points into the object it came
 * from and stays valid until that object is freed (the engine, the segment
 * info, the notification list). Strings the caller owns are copied into its
 * buffer: (buf, buf_len, out_len) writes the value and a NUL when it fits
 * (FERRY_OK), or as much as fits plus a NUL and returns
 * FERRY_RESOURCE_EXHAUSTED; either way *out_len (may be NULL) is the value's
 * length without the NUL. buf == NULL with buf_len == 0 asks only for the
 * length (FERRY_OK).
 *
 * Threads. An engine may be used from any number of threads at once;
 * blocking calls block only their caller. ferry_engine_destroy must not run
 * while another thread is still inside a call on the same engine. An options
 * object, a segment info or a notification list is not synchronized: use it
 * from one thread at a time.
 *
 * Memory. Memory passed to ferry_memory_register must stay valid until it is
 * unregistered (or the engine destroyed). Destroying an engine fails what is
 * still in flight with FERRY_CANCELLED.
 */
#ifndef FERRY_FERRY_C_H_
#define FERRY_FERRY_C_H_

#include <stddef.h>
#include <stdint.h>

/* Marks the API's functions as exported: the library is built with hidden
 * visibility, and only these are its interface. */
#if defined(__GNUC__) || defined(__clang__)
#define FERRY_C_API __attribute__((visibility("default")))
#else
#define FERRY_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status ------------------------------------------------------------ */

typedef int ferry_status_t;

/* The numbers of ferry::StatusCode (ferry/status.h, where each one's meaning
 * is: what the caller should do next). */
enum {
  FERRY_OK = 0,
  FERRY_CANCELLED = 1,
  FERRY_UNKNOWN = 2,
  FERRY_INVALID_ARGUMENT = 3,
  FERRY_DEADLINE_EXCEEDED = 4,
  FERRY_NOT_FOUND = 5,
  FERRY_ALREADY_EXISTS = 6,
  FERRY_RESOURCE_EXHAUSTED = 8,
  FERRY_FAILED_PRECONDITION = 9,
  FERRY_UNIMPLEMENTED = 12,
  FERRY_INTERNAL = 13,
  FERRY_UNAVAILABLE = 14,
  FERRY_DATA_LOSS = 15,
  FERRY_UNAUTHENTICATED = 16
};

/* The message of this thread's last failed call ("" after a success). */
FERRY_C_API const char* ferry_last_error(void);
/* "OK", "INVALID_ARGUMENT", ... ("UNKNOWN" for a number that is no code). */
FERRY_C_API const char* ferry_status_name(ferry_status_t code);
/* The library's version ("0.1.0"). */
FERRY_C_API const char* ferry_version(void);

/* ---- Plain values --------------------------------------------------------- */

/* Opcodes of a request. */
enum {
  FERRY_OP_READ = 0, /* copy remote bytes into local memory */
  FERRY_OP_WRITE = 1 /* copy local bytes into the remote segment */
};

/* States of a request, a batch or a prepared transfer. */
enum { FERRY_STATE_PENDING = 0, FERRY_STATE_COMPLETED = 1, FERRY_STATE_FAILED = 2 };

typedef uint64_t ferry_segment_t;   /* an opened peer segment */
typedef uint64_t ferry_batch_t;     /* a batch of requests */
typedef uint64_t ferry_desc_list_t; /* a prepared descriptor list */
typedef uint64_t ferry_xfer_t;      /* a prepared transfer */

/* One one-sided operation: `local` lies in memory registered with this
 * engine, [remote_addr, remote_addr + length) in a region the peer
 * registered (addresses are the peer's own). */
typedef struct ferry_request {
  int32_t opcode; /* FERRY_OP_READ or FERRY_OP_WRITE */
  void* local;
  ferry_segment_t segment;
  uint64_t remote_addr;
  uint64_t length;
} ferry_request_t;

typedef struct ferry_batch_status {
  int32_t state;              /* FERRY_STATE_*: FAILED if any request failed */
  ferry_status_t first_error; /* the first failure's code (its message: ferry_last_error) */
  uint64_t submitted;
  uint64_t completed;
  uint64_t failed;
} ferry_batch_status_t;

/* A row of a descriptor list: [addr, addr + length), or with count > 1 the
 * `count` entries addr + k * stride. count 0 is refused; 1 is one entry. */
typedef struct ferry_desc_row {
  uint64_t addr;
  uint64_t length;
  uint64_t stride;
  uint64_t count;
} ferry_desc_row_t;

/* What one post of a prepared transfer took, in microseconds of the
 * monotonic clock (start_us: since its epoch). */
typedef struct ferry_xfer_telemetry {
  uint64_t start_us;
  uint64_t post_us;
  uint64_t transfer_us; /* 0 while pending */
  uint64_t bytes;
  uint64_t entries; /* requests after merging adjacent entries */
} ferry_xfer_telemetry_t;

/* ---- Options ------------------------------------------------------------ */

typedef struct ferry_options ferry_options_t;

/* Every option at its default (ferry::EngineOptions{}). */
FERRY_C_API ferry_status_t ferry_options_new(ferry_options_t** out);
/* NULL is a no-op (FERRY_OK). */
FERRY_C_API ferry_status_t ferry_options_free(ferry_options_t* opts);
/* Sets the option `name` (a row of docs/configuration.md: "transport",
 * "tcp_streams", "transfer_timeout", ...) from text: integers in decimal in
 * the option's unit ("5000" for a timeout in ms). FERRY_INVALID_ARGUMENT,
 * leaving the options as they were, for an unknown name (naming the closest
 * known ones), an integer that does not parse or is out of range (naming the
 * option, its range and the value), or a transport this build does not have
 * (naming those it has). Bounds between options (max_frame_bytes >=
 * slice_size) are checked by ferry_engine_new. */
FERRY_C_API ferry_status_t ferry_options_set(ferry_options_t* opts, const char* name,
                                             const char* value);
/* The option's value as text (the buffer convention above). */
FERRY_C_API ferry_status_t ferry_options_get(const ferry_options_t* opts, const char* name,
                                             char* buf, size_t buf_len, size_t* out_len);
/* Overlays the FERRY_* environment variables (docs/configuration.md); an
 * invalid value is reported on stderr and ignored. */
FERRY_C_API ferry_status_t ferry_options_apply_environment(ferry_options_t* opts);

/* OK if the transport `name` is built in and can work on this machine;
 * FERRY_FAILED_PRECONDITION with the reason if it cannot here (shm where one
 * process may not read another's memory); FERRY_NOT_FOUND if no transport
 * has that name. */
FERRY_C_API ferry_status_t ferry_transport_check(const char* name);

/* ---- Engine ------------------------------------------------------------- */

typedef struct ferry_engine ferry_engine_t;

/* Starts an engine (binds its rpc port) with `opts` (NULL: the defaults),
 * which are copied: the caller may free them right after. */
FERRY_C_API ferry_status_t ferry_engine_new(const ferry_options_t* opts, ferry_engine_t** out);
/* Stops the engine and frees it; NULL is a no-op (FERRY_OK). */
FERRY_C_API ferry_status_t ferry_engine_destroy(ferry_engine_t* engine);
/* "host:port": how peers name this engine (ferry_segment_open's peer id).
 * Owned by the engine; valid until it is destroyed. */
FERRY_C_API ferry_status_t ferry_engine_peer_id(const ferry_engine_t* engine, const char** out);
/* The local segment name (default: the peer id). Owned by the engine. */
FERRY_C_API ferry_status_t ferry_engine_local_name(const ferry_engine_t* engine, const char** out);
FERRY_C_API ferry_status_t ferry_engine_rpc_port(const ferry_engine_t* engine, uint16_t* out);
/* An option in effect (after defaults were resolved), as ferry_options_get. */
FERRY_C_API ferry_status_t ferry_engine_option(const ferry_engine_t* engine, const char* name,
                                               char* buf, size_t buf_len, size_t* out_len);

/* ---- Memory ------------------------------------------------------------- */

/* `location` names the memory kind ("cpu", "cpu:N", "cuda:N", "*"; NULL =
 * "*"). FERRY_ALREADY_EXISTS: overlaps a registered region. */
FERRY_C_API ferry_status_t ferry_memory_register(ferry_engine_t* engine, void* addr, size_t length,
                                                 const char* location);
/* FERRY_NOT_FOUND: no region starts at `addr`. Once it returns, no transfer
 * touches the region any more (ferry/engine.h says the details).
 * FERRY_FAILED_PRECONDITION: a fabric operation that failed at its deadline
 * may still touch it (after waiting transfer_timeout for it); the region
 * stays registered: do not free the memory yet. */
FERRY_C_API ferry_status_t ferry_memory_unregister(ferry_engine_t* engine, void* addr);

/* Shared memory (docs/architecture.md, "Mapped segments"): memory a peer on
 * the same host maps, so its copies into and out of it are plain loads and
 * stores (shm transport) without a request to this engine.
 *
 * ferry_memory_allocate_shared: `length` bytes of zero-filled host memory
 * (a sealed memfd), registered (`location`: "cpu", "cpu:N" or "*"; NULL =
 * "cpu"; `exported` 0: for this engine's own transfers only); its address in
 * *out (NULL on failure). It belongs to the engine: free it with
 * ferry_memory_free_shared (not ferry_memory_unregister); it is unmapped
 * when the engine is destroyed. FERRY_INVALID_ARGUMENT: length 0 or a
 * location that is not host memory; FERRY_RESOURCE_EXHAUSTED: no memory or
 * descriptor. */
FERRY_C_API ferry_status_t ferry_memory_allocate_shared(ferry_engine_t* engine, size_t length,
                                                        const char* location, int exported,
                                                        void** out);
/* Unregisters memory from ferry_memory_allocate_shared (as
 * ferry_memory_unregister; peers' copies through their mappings have ended
 * too) and unmaps it. FERRY_NOT_FOUND: not such memory of this engine. */
FERRY_C_API ferry_status_t ferry_memory_free_shared(ferry_engine_t* engine, void* addr);
/* Registers host memory that is a MAP_SHARED mapping of `fd` (a memfd sealed
 * against shrinking: F_SEAL_SHRINK), `addr` mapping file offset `fd_offset`,
 * so same-host peers map it too. The engine keeps a duplicate of `fd` (close
 * yours when you like); unregister with ferry_memory_unregister.
 * FERRY_INVALID_ARGUMENT, naming what is wrong: a descriptor that is not
 * such a memfd, not sealed, or not what [addr, addr + length) maps there. */
FERRY_C_API ferry_status_t ferry_memory_register_shared(ferry_engine_t* engine, void* addr,
                                                        size_t length, const char* location, int fd,
                                                        uint64_t fd_offset);

/* ---- Segments ----------------------------------------------------------- */

/* Opens the segment of a peer: its peer id ("host:port") or, with a
 * metadata store, its name. Cached: the same peer gives the same handle.
 * FERRY_UNAVAILABLE: unreachable; FERRY_NOT_FOUND: no such name. */
FERRY_C_API ferry_status_t ferry_segment_open(ferry_engine_t* engine, const char* peer,
                                              ferry_segment_t* out);
FERRY_C_API ferry_status_t ferry_segment_close(ferry_engine_t* engine, ferry_segment_t segment);

typedef struct ferry_segment_info ferry_segment_info_t;

/* Re-handshakes with the peer and returns what it advertises now; free the
 * result with ferry_segment_info_free. */
FERRY_C_API ferry_status_t ferry_segment_query(ferry_engine_t* engine, ferry_segment_t segment,
                                               ferry_segment_info_t** out);
FERRY_C_API ferry_status_t ferry_segment_info_free(ferry_segment_info_t* info); /* NULL: no-op */
/* Strings owned by the info. */
FERRY_C_API ferry_status_t ferry_segment_info_peer_id(const ferry_segment_info_t* info,
                                                      const char** out);
FERRY_C_API ferry_status_t ferry_segment_info_name(const ferry_segment_info_t* info,
                                                   const char** out);
/* The transport of cpu-to-cpu data ("shm", "tcp", ...). */
FERRY_C_API ferry_status_t ferry_segment_info_transport(const ferry_segment_info_t* info,
                                                        const char** out);
/* New on every start of the peer. */
FERRY_C_API ferry_status_t ferry_segment_info_instance_id(const ferry_segment_info_t* info,
                                                          uint64_t* out);
FERRY_C_API ferry_status_t ferry_segment_info_region_count(const ferry_segment_info_t* info,
                                                           size_t* out);
/* The index-th region the peer exported (registration order); `kind` ("cpu",
 * "cuda:0", ...) is owned by the info; any out-pointer may be NULL.
 * FERRY_INVALID_ARGUMENT: index out of range. */
FERRY_C_API ferry_status_t ferry_segment_info_region(const ferry_segment_info_t* info, size_t index,
                                                     uint64_t* addr, uint64_t* length,
                                                     const char** kind);

/* ---- Batches ------------------------------------------------------------ */

/* FERRY_INVALID_ARGUMENT: capacity 0 or above the limit (2^24). */
FERRY_C_API ferry_status_t ferry_batch_allocate(ferry_engine_t* engine, size_t capacity,
                                                ferry_batch_t* out);
/* Validates every request first: if one is bad, none is submitted and the
 * error names it. FERRY_RESOURCE_EXHAUSTED: more than the remaining
 * capacity. The requests of a batch run in no particular order. */
FERRY_C_API ferry_status_t ferry_batch_submit(ferry_engine_t* engine, ferry_batch_t batch,
                                              const ferry_request_t* requests, size_t count);
/* Waits until every submitted request finished or timeout_ms passed (< 0:
 * no limit but the requests' own transfer_timeout). OK: all completed; the
 * first failure's code if any failed; FERRY_DEADLINE_EXCEEDED if some are
 * still pending. */
FERRY_C_API ferry_status_t ferry_batch_wait(ferry_engine_t* engine, ferry_batch_t batch,
                                            int64_t timeout_ms);
FERRY_C_API ferry_status_t ferry_batch_status(ferry_engine_t* engine, ferry_batch_t batch,
                                              ferry_batch_status_t* out);
/* ferry_batch_status after polling the batch for at most spin_us (< 0: the
 * engine's await_spin option), never blocking: what an event loop calls
 * before it waits on ferry_engine_completion_fd, so a small transfer ends
 * here, with no wake-up (a same-host reply is read by this thread). */
FERRY_C_API ferry_status_t ferry_batch_spin(ferry_engine_t* engine, ferry_batch_t batch,
                                            int64_t spin_us, ferry_batch_status_t* out);
/* The index-th submitted request: *state is FERRY_STATE_*; *request_status
 * (may be NULL) is FERRY_OK unless it failed, then its code, with its
 * message in ferry_last_error (the call itself returns FERRY_OK). */
FERRY_C_API ferry_status_t ferry_batch_request_status(ferry_engine_t* engine, ferry_batch_t batch,
                                                      size_t index, int32_t* state,
                                                      ferry_status_t* request_status);
/* Cancels the requests still pending (they fail with FERRY_CANCELLED); no
 * byte of a read of the batch lands locally afterwards. */
FERRY_C_API ferry_status_t ferry_batch_cancel(ferry_engine_t* engine, ferry_batch_t batch);
/* FERRY_FAILED_PRECONDITION while requests are still pending. */
FERRY_C_API ferry_status_t ferry_batch_free(ferry_engine_t* engine, ferry_batch_t batch);

/* Synchronous transfers: submit, wait (the engine's transfer_timeout) and
 * free. FERRY_OK iff every request completed. */
FERRY_C_API ferry_status_t ferry_transfer_sync(ferry_engine_t* engine,
                                               const ferry_request_t* requests, size_t count);
/* One write of `length` bytes from `local` to the peer's `remote_addr`. */
FERRY_C_API ferry_status_t ferry_write_sync(ferry_engine_t* engine, ferry_segment_t segment,
                                            const void* local, uint64_t remote_addr,
                                            uint64_t length);
/* One read of `length` bytes from the peer's `remote_addr` into `local`. */
FERRY_C_API ferry_status_t ferry_read_sync(ferry_engine_t* engine, ferry_segment_t segment,
                                           void* local, uint64_t remote_addr, uint64_t length);

/* ---- Notifications ------------------------------------------------------ */

/* Delivers {name, message} to the peer after every write this engine
 * submitted to it before this call completed; blocks until the peer
 * acknowledged it. `message` may hold any bytes (NULL with length 0). */
FERRY_C_API ferry_status_t ferry_notify_send(ferry_engine_t* engine, ferry_segment_t segment,
                                             const char* name, const void* message,
                                             size_t message_len);

typedef struct ferry_notifications ferry_notifications_t;

/* Takes the notifications received so far, oldest first, into a new list
 * (possibly empty); free it with ferry_notifications_free. */
FERRY_C_API ferry_status_t ferry_notify_drain(ferry_engine_t* engine, ferry_notifications_t** out);
FERRY_C_API ferry_status_t ferry_notifications_free(ferry_notifications_t* list); /* NULL: no-op */
FERRY_C_API ferry_status_t ferry_notifications_count(const ferry_notifications_t* list,
                                                     size_t* out);
/* The index-th notification: the sender's peer id, the name, the message
 * (its bytes, followed by a NUL not counted in message_len). Owned by the
 * list; any out-pointer may be NULL. */
FERRY_C_API ferry_status_t ferry_notifications_get(const ferry_notifications_t* list, size_t index,
                                                   const char** sender, const char** name,
                                                   const void** message, size_t* message_len);

/* ---- Prepared lists and transfers --------------------------------------- */

/* A descriptor list registered once and then named by entry index: local
 * rows are checked against this engine's registered memory, remote ones
 * against the segment's regions as of its last handshake (no round trip).
 * FERRY_NOT_FOUND: an entry outside every (exported) region, naming the
 * row. */
FERRY_C_API ferry_status_t ferry_list_prepare_local(ferry_engine_t* engine,
                                                    const ferry_desc_row_t* rows, size_t count,
                                                    ferry_desc_list_t* out);
FERRY_C_API ferry_status_t ferry_list_prepare_remote(ferry_engine_t* engine,
                                                     ferry_segment_t segment,
                                                     const ferry_desc_row_t* rows, size_t count,
                                                     ferry_desc_list_t* out);
/* Entries of the list (rows with their strides expanded). */
FERRY_C_API ferry_status_t ferry_list_entries(ferry_engine_t* engine, ferry_desc_list_t list,
                                              size_t* out);
/* Transfers made from the list keep what they need. */
FERRY_C_API ferry_status_t ferry_list_release(ferry_engine_t* engine, ferry_desc_list_t list);

/* A transfer of pairs: local entry local_indices[k] with remote entry
 * remote_indices[k] (equally many). Checked once here; adjacent pairs are
 * merged. notify_name != NULL: {notify_name, notify_message} reaches the
 * peer once the transfer's data is complete there (for a read: once it is
 * here). */
FERRY_C_API ferry_status_t ferry_xfer_make(ferry_engine_t* engine, int32_t opcode,
                                           ferry_desc_list_t local, const uint32_t* local_indices,
                                           size_t local_count, ferry_desc_list_t remote,
                                           const uint32_t* remote_indices, size_t remote_count,
                                           const char* notify_name, const void* notify_message,
                                           size_t notify_message_len, ferry_xfer_t* out);
/* Posts it (again, once an earlier post finished). notify_name != NULL
 * replaces make's notification for this post. FERRY_FAILED_PRECONDITION:
 * still in flight, or the peer restarted since the remote list was made. */
FERRY_C_API ferry_status_t ferry_xfer_post(ferry_engine_t* engine, ferry_xfer_t xfer,
                                           const char* notify_name, const void* notify_message,
                                           size_t notify_message_len);
/* Like ferry_batch_request_status, for the transfer's current post.
 * FERRY_FAILED_PRECONDITION: never posted. */
FERRY_C_API ferry_status_t ferry_xfer_status(ferry_engine_t* engine, ferry_xfer_t xfer,
                                             int32_t* state, ferry_status_t* xfer_status);
/* Like ferry_batch_spin, for the transfer's current post (its notification
 * included), then ferry_xfer_status. */
FERRY_C_API ferry_status_t ferry_xfer_spin(ferry_engine_t* engine, ferry_xfer_t xfer,
                                           int64_t spin_us, int32_t* state,
                                           ferry_status_t* xfer_status);
/* Like ferry_batch_wait. */
FERRY_C_API ferry_status_t ferry_xfer_wait(ferry_engine_t* engine, ferry_xfer_t xfer,
                                           int64_t timeout_ms);
/* Of the last post; FERRY_FAILED_PRECONDITION if never posted. */
FERRY_C_API ferry_status_t ferry_xfer_telemetry(ferry_engine_t* engine, ferry_xfer_t xfer,
                                                ferry_xfer_telemetry_t* out);
/* Cancels the current post if pending; it may be posted again right away. */
FERRY_C_API ferry_status_t ferry_xfer_cancel(ferry_engine_t* engine, ferry_xfer_t xfer);
/* Cancels it if in flight and forgets it. */
FERRY_C_API ferry_status_t ferry_xfer_release(ferry_engine_t* engine, ferry_xfer_t xfer);

/* ---- Telemetry ---------------------------------------------------------- */

/* The engine's counters in Prometheus' text exposition format (the buffer
 * convention above; the text grows between calls, so leave room). */
FERRY_C_API ferry_status_t ferry_metrics_text(ferry_engine_t* engine, char* buf, size_t buf_len,
                                              size_t* out_len);

/* ---- Completion fd ------------------------------------------------------ */

/* The engine's completion eventfd (Engine::CompletionFd in ferry/engine.h):
 * readable once any batch or prepared transfer of the engine finished
 * (completed, failed or cancelled) since it was last read. The protocol, so
 * that no finish is lost: get the fd before submitting or posting what you
 * will wait for; then loop { read(fd) 8 bytes to reset it (EAGAIN: it was 0);
 * check the status of each batch / transfer you wait for; stop if all
 * finished; wait until fd is readable (poll, epoll, an event loop) }. One
 * reader per fd. The engine owns it (do not close it) and closes it when
 * destroyed: remove it from your event loop first, or wait on a dup().
 * RESOURCE_EXHAUSTED when the eventfd cannot be made (the descriptor limit). */
FERRY_C_API ferry_status_t ferry_engine_completion_fd(ferry_engine_t* engine, int* out_fd);

/* What finished since the previous call (Engine::TakeFinished): the batches
 * and prepared transfers whose finish made the fd readable, recorded from the
 * first ferry_engine_completion_fd call on. After the protocol's read a waiter
 * may check only these (and, on its first round, what it began waiting for
 * before). Up to `batches_cap` batch ids go to `batches` (*out_batches: how
 * many), up to `xfers_cap` transfers to `xfers` (*out_xfers);
 * *out_overflowed is 1 when more finished than the engine keeps or than the
 * arrays hold (the rest are dropped): then check everything waited for. An
 * array may be NULL with a cap of 0. One taker per engine, like the read. */
FERRY_C_API ferry_status_t ferry_engine_take_finished(ferry_engine_t* engine,
                                                      ferry_batch_t* batches, size_t batches_cap,
                                                      size_t* out_batches, ferry_xfer_t* xfers,
                                                      size_t xfers_cap, size_t* out_xfers,
                                                      int* out_overflowed);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FERRY_FERRY_C_H_ */
