/* The C API (include/ferry/ferry_c.h) driven from C11: two engines in this
 * process over tcp and over shm (the conformance suite runs shm between two
 * engines of one process too), every byte verified; then the error paths:
 * bad option names and values, unregistered memory, unknown segments, NULL
 * handles and pointers, each with its status and a message naming what was
 * wrong. Prints each failed check and exits 1 if any failed. */
#define _POSIX_C_SOURCE 200809L /* poll(2), read(2) for the completion fd */
#define _GNU_SOURCE             /* memfd_create(2) and F_ADD_SEALS, for shared memory */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ferry/ferry_c.h"

static int g_failures = 0;

/* A check failed: prints where, what and the last error. */
static void fail_at(int line, const char* what, ferry_status_t got, const char* detail) {
  ++g_failures;
  fprintf(stderr, "c_api_test.c:%d: FAILED: %s (got %s: \"%s\")%s%s\n", line, what,
          ferry_status_name(got), ferry_last_error(), detail[0] != '\0' ? ": " : "", detail);
}

/* `call` returned FERRY_OK, and the last error is empty. */
static int expect_ok(int line, const char* what, ferry_status_t got) {
  if (got != FERRY_OK) {
    fail_at(line, what, got, "expected OK");
    return 0;
  }
  if (ferry_last_error()[0] != '\0') {
    fail_at(line, what, got, "OK left a last error");
    return 0;
  }
  return 1;
}

/* `call` returned `want`, and the last error contains each of `needles`
 * (a NULL-terminated list). */
static int expect_status(int line, const char* what, ferry_status_t got, ferry_status_t want,
                         const char* const* needles) {
  char detail[256];
  if (got != want) {
    snprintf(detail, sizeof(detail), "expected %s", ferry_status_name(want));
    fail_at(line, what, got, detail);
    return 0;
  }
  for (; needles != NULL && *needles != NULL; ++needles) {
    if (strstr(ferry_last_error(), *needles) == NULL) {
      snprintf(detail, sizeof(detail), "the message does not name \"%s\"", *needles);
      fail_at(line, what, got, detail);
      return 0;
    }
  }
  return 1;
}

#define EXPECT_OK(call) expect_ok(__LINE__, #call, (call))
/* EXPECT_STATUS(call, FERRY_X, "words", "the", "message", "has") */
#define EXPECT_STATUS(call, want, ...)                              \
  do {                                                              \
    static const char* const needles_[] = {__VA_ARGS__, NULL};      \
    (void)expect_status(__LINE__, #call, (call), (want), needles_); \
  } while (0)
#define EXPECT_TRUE(cond)                                             \
  do {                                                                \
    if (!(cond)) fail_at(__LINE__, #cond, FERRY_OK, "expected true"); \
  } while (0)
/* Stops the current case: later checks would only repeat the failure. */
#define REQUIRE_OK(call)                             \
  do {                                               \
    if (!expect_ok(__LINE__, #call, (call))) return; \
  } while (0)

enum { kBytes = 1 << 20, kPiece = 4096, kPieces = 8 };

static uint64_t addr_of(const void* p) { return (uint64_t)(uintptr_t)p; }

/* Byte i of pattern `seed`. */
static unsigned char pattern(unsigned seed, size_t i) {
  return (unsigned char)((i * 131u + seed * 7u + (i >> 9)) & 0xffu);
}
static void fill(char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (char)pattern(seed, i);
}
static int matches(const char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) {
    if ((unsigned char)p[i] != pattern(seed, i)) return 0;
  }
  return 1;
}

/* Options forcing `transport`, with generous timeouts (nothing here
 * asserts how fast anything is). */
static ferry_options_t* make_options(const char* transport) {
  ferry_options_t* o = NULL;
  if (!EXPECT_OK(ferry_options_new(&o))) return NULL;
  EXPECT_OK(ferry_options_set(o, "transport", transport));
  EXPECT_OK(ferry_options_set(o, "listen_host", "127.0.0.1"));
  EXPECT_OK(ferry_options_set(o, "transfer_timeout", "60000"));
  return o;
}

/* Two engines, one buffer each, the target's segment opened. */
typedef struct pair {
  ferry_engine_t* initiator;
  ferry_engine_t* target;
  char* local;
  char* remote;
  ferry_segment_t segment;
} pair_t;

static void pair_close(pair_t* p) {
  if (p->initiator != NULL && p->local != NULL) ferry_memory_unregister(p->initiator, p->local);
  if (p->target != NULL && p->remote != NULL) ferry_memory_unregister(p->target, p->remote);
  EXPECT_OK(ferry_engine_destroy(p->initiator));
  EXPECT_OK(ferry_engine_destroy(p->target));
  free(p->local);
  free(p->remote);
  memset(p, 0, sizeof(*p));
}

static int pair_open(pair_t* p, const char* transport) {
  memset(p, 0, sizeof(*p));
  ferry_options_t* o = make_options(transport);
  if (o == NULL) return 0;
  int ok =
      EXPECT_OK(ferry_engine_new(o, &p->target)) && EXPECT_OK(ferry_engine_new(o, &p->initiator));
  EXPECT_OK(ferry_options_free(o));
  p->local = calloc(kBytes, 1);
  p->remote = calloc(kBytes, 1);
  EXPECT_TRUE(p->local != NULL && p->remote != NULL);
  const char* peer = NULL;
  ok = ok && p->local != NULL && p->remote != NULL &&
       EXPECT_OK(ferry_memory_register(p->initiator, p->local, kBytes, "cpu")) &&
       EXPECT_OK(ferry_memory_register(p->target, p->remote, kBytes, NULL)) &&
       EXPECT_OK(ferry_engine_peer_id(p->target, &peer)) &&
       EXPECT_OK(ferry_segment_open(p->initiator, peer, &p->segment));
  EXPECT_TRUE(!ok || p->segment != 0);
  if (!ok) pair_close(p);
  return ok;
}

/* The segment's info: the forced transport, the target's one region. */
static void check_segment_info(pair_t* p, const char* transport) {
  ferry_segment_info_t* info = NULL;
  REQUIRE_OK(ferry_segment_query(p->initiator, p->segment, &info));
  const char *peer_id = NULL, *name = NULL, *used = NULL, *kind = NULL, *target_id = NULL;
  uint64_t instance = 0, addr = 0, length = 0;
  size_t regions = 0;
  EXPECT_OK(ferry_engine_peer_id(p->target, &target_id));
  EXPECT_OK(ferry_segment_info_peer_id(info, &peer_id));
  EXPECT_OK(ferry_segment_info_name(info, &name));
  EXPECT_OK(ferry_segment_info_transport(info, &used));
  EXPECT_OK(ferry_segment_info_instance_id(info, &instance));
  EXPECT_OK(ferry_segment_info_region_count(info, &regions));
  EXPECT_TRUE(peer_id != NULL && target_id != NULL && strcmp(peer_id, target_id) == 0);
  EXPECT_TRUE(name != NULL && name[0] != '\0');
  EXPECT_TRUE(used != NULL && strcmp(used, transport) == 0);
  EXPECT_TRUE(instance != 0);
  EXPECT_TRUE(regions == 1);
  EXPECT_OK(ferry_segment_info_region(info, 0, &addr, &length, &kind));
  EXPECT_TRUE(addr == addr_of(p->remote) && length == kBytes);
  EXPECT_TRUE(kind != NULL && strcmp(kind, "cpu") == 0);
  EXPECT_STATUS(ferry_segment_info_region(info, 1, NULL, NULL, NULL), FERRY_INVALID_ARGUMENT,
                "region 1", "1 regions");
  EXPECT_OK(ferry_segment_info_free(info));
}

/* Fills the local buffer with `seed`'s pattern and `r` with kPieces writes of
 * it to the peer's buffer, piece by piece. */
static void pattern_writes(pair_t* p, ferry_request_t r[kPieces], unsigned seed) {
  fill(p->local, kPieces * kPiece, seed);
  for (int i = 0; i < kPieces; ++i) {
    r[i].opcode = FERRY_OP_WRITE;
    r[i].local = p->local + i * kPiece;
    r[i].segment = p->segment;
    r[i].remote_addr = addr_of(p->remote) + (uint64_t)i * kPiece;
    r[i].length = kPiece;
  }
}

/* A batch of writes, then reads of the same into another half, per-request
 * states, the batch's summary. */
static void check_batch(pair_t* p) {
  ferry_request_t r[kPieces];
  pattern_writes(p, r, 1);
  ferry_batch_t batch = 0;
  REQUIRE_OK(ferry_batch_allocate(p->initiator, kPieces, &batch));
  EXPECT_TRUE(batch != 0);
  REQUIRE_OK(ferry_batch_submit(p->initiator, batch, r, kPieces));
  REQUIRE_OK(ferry_batch_wait(p->initiator, batch, 120000));
  EXPECT_TRUE(matches(p->remote, kPieces * kPiece, 1));
  for (int i = 0; i < kPieces; ++i) {
    int32_t state = -1;
    ferry_status_t request = -1;
    EXPECT_OK(ferry_batch_request_status(p->initiator, batch, (size_t)i, &state, &request));
    EXPECT_TRUE(state == FERRY_STATE_COMPLETED && request == FERRY_OK);
  }
  ferry_batch_status_t summary;
  EXPECT_OK(ferry_batch_status(p->initiator, batch, &summary));
  EXPECT_TRUE(summary.state == FERRY_STATE_COMPLETED && summary.first_error == FERRY_OK);
  EXPECT_TRUE(summary.submitted == kPieces && summary.completed == kPieces && summary.failed == 0);
  /* Full: the capacity was kPieces. */
  EXPECT_STATUS(ferry_batch_submit(p->initiator, batch, r, 1), FERRY_RESOURCE_EXHAUSTED,
                "capacity");
  EXPECT_OK(ferry_batch_free(p->initiator, batch));
  EXPECT_STATUS(ferry_batch_wait(p->initiator, batch, 0), FERRY_INVALID_ARGUMENT, "batch");

  /* The same bytes read back, with one synchronous multi-request call. */
  char* back = p->local + kBytes / 2;
  for (int i = 0; i < kPieces; ++i) {
    r[i].opcode = FERRY_OP_READ;
    r[i].local = back + i * kPiece;
  }
  EXPECT_OK(ferry_transfer_sync(p->initiator, r, kPieces));
  EXPECT_TRUE(matches(back, kPieces * kPiece, 1));

  /* An event loop's first look: spin up to longer than a request lives (it
   * returns once the batch ended), then the engine's await_spin on a batch
   * already ended. */
  pattern_writes(p, r, 2);
  REQUIRE_OK(ferry_batch_allocate(p->initiator, kPieces, &batch));
  REQUIRE_OK(ferry_batch_submit(p->initiator, batch, r, kPieces));
  EXPECT_OK(ferry_batch_spin(p->initiator, batch, INT64_C(120000000), &summary));
  EXPECT_TRUE(summary.state == FERRY_STATE_COMPLETED && summary.completed == kPieces);
  EXPECT_TRUE(matches(p->remote, kPieces * kPiece, 2));
  EXPECT_OK(ferry_batch_spin(p->initiator, batch, -1, &summary));
  EXPECT_TRUE(summary.state == FERRY_STATE_COMPLETED);
  EXPECT_STATUS(ferry_batch_spin(p->initiator, batch, 0, NULL), FERRY_INVALID_ARGUMENT, "out");
  EXPECT_OK(ferry_batch_free(p->initiator, batch));
  EXPECT_STATUS(ferry_batch_spin(p->initiator, batch, 0, &summary), FERRY_INVALID_ARGUMENT,
                "not allocated");
}

/* The completion fd, by its protocol: a batch waited for with poll(2), no
 * ferry_batch_wait; the fd is readable only after something finished. */
static void check_completion_fd(pair_t* p) {
  int fd = -1;
  REQUIRE_OK(ferry_engine_completion_fd(p->initiator, &fd));
  EXPECT_TRUE(fd >= 0);
  int again = -1;
  EXPECT_OK(ferry_engine_completion_fd(p->initiator, &again));
  EXPECT_TRUE(again == fd); /* one fd per engine */
  uint64_t count = 0;
  while (read(fd, &count, sizeof(count)) == (ssize_t)sizeof(count)) {
  } /* earlier finishes: reset */
  struct pollfd pfd = {fd, POLLIN, 0};
  EXPECT_TRUE(poll(&pfd, 1, 0) == 0); /* nothing finished since */

  ferry_request_t r[kPieces];
  pattern_writes(p, r, 7);
  ferry_batch_t batch = 0;
  REQUIRE_OK(ferry_batch_allocate(p->initiator, kPieces, &batch));
  REQUIRE_OK(ferry_batch_submit(p->initiator, batch, r, kPieces));
  ferry_batch_status_t summary;
  int wakeups = 0;
  for (;;) {
    if (read(fd, &count, sizeof(count)) < 0 && errno != EAGAIN) {
      fail_at(__LINE__, "read(completion fd)", FERRY_INTERNAL, strerror(errno));
      break;
    }
    if (!EXPECT_OK(ferry_batch_status(p->initiator, batch, &summary))) break;
    if (summary.state != FERRY_STATE_PENDING) break;
    pfd.revents = 0;
    if (poll(&pfd, 1, 120000) != 1) { /* bounded: the transfer timeout is shorter */
      fail_at(__LINE__, "poll(completion fd)", FERRY_DEADLINE_EXCEEDED, "not readable");
      break;
    }
    ++wakeups;
  }
  EXPECT_TRUE(summary.state == FERRY_STATE_COMPLETED && summary.completed == kPieces);
  EXPECT_TRUE(wakeups <= 1); /* one batch: one write, at most one wake-up */
  EXPECT_TRUE(matches(p->remote, kPieces * kPiece, 7));
  /* What finished since the fd was asked for: that batch, once. Its finish
   * is recorded just before the fd's write, which may come after its status
   * showed it completed: if the take finds nothing yet, wait for the write. */
  ferry_batch_t done[4] = {0};
  ferry_xfer_t done_xfers[4] = {0};
  size_t n_done = 99, n_xfers = 99;
  int overflowed = -1;
  EXPECT_OK(ferry_engine_take_finished(p->initiator, done, 4, &n_done, done_xfers, 4, &n_xfers,
                                       &overflowed));
  if (n_done == 0) {
    pfd.revents = 0;
    EXPECT_TRUE(poll(&pfd, 1, 120000) == 1); /* bounded: a missing record fails here */
    EXPECT_OK(ferry_engine_take_finished(p->initiator, done, 4, &n_done, done_xfers, 4, &n_xfers,
                                         &overflowed));
  }
  EXPECT_TRUE(n_done == 1 && done[0] == batch && n_xfers == 0 && overflowed == 0);
  EXPECT_OK(ferry_engine_take_finished(p->initiator, done, 4, &n_done, done_xfers, 4, &n_xfers,
                                       &overflowed));
  EXPECT_TRUE(n_done == 0 && n_xfers == 0 && overflowed == 0); /* taken */
  EXPECT_OK(ferry_batch_free(p->initiator, batch));
  /* More finished than the array holds: overflowed, check everything. The
   * synchronous call may return before its finish is recorded: once the fd
   * is readable (its write follows the record), it is. */
  while (read(fd, &count, sizeof(count)) == (ssize_t)sizeof(count)) {
  }
  REQUIRE_OK(ferry_write_sync(p->initiator, p->segment, p->local, addr_of(p->remote), kPiece));
  pfd.revents = 0;
  EXPECT_TRUE(poll(&pfd, 1, 120000) == 1);
  EXPECT_OK(
      ferry_engine_take_finished(p->initiator, NULL, 0, &n_done, NULL, 0, &n_xfers, &overflowed));
  EXPECT_TRUE(n_done == 0 && overflowed == 1);
  EXPECT_STATUS(
      ferry_engine_take_finished(p->initiator, NULL, 1, &n_done, NULL, 0, &n_xfers, &overflowed),
      FERRY_INVALID_ARGUMENT, "batches is NULL");
  EXPECT_STATUS(
      ferry_engine_take_finished(p->initiator, done, 4, NULL, done_xfers, 4, &n_xfers, &overflowed),
      FERRY_INVALID_ARGUMENT, "out_batches");
  EXPECT_STATUS(ferry_engine_completion_fd(NULL, &fd), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_engine_completion_fd(p->initiator, NULL), FERRY_INVALID_ARGUMENT, "out_fd");
}

/* The one-request helpers, at an odd offset and length. */
static void check_sync_helpers(pair_t* p) {
  const size_t n = 100001, at = 12345;
  fill(p->local, n, 2);
  EXPECT_OK(ferry_write_sync(p->initiator, p->segment, p->local, addr_of(p->remote) + at, n));
  EXPECT_TRUE(matches(p->remote + at, n, 2));
  memset(p->local + kBytes / 2, 0, n);
  EXPECT_OK(
      ferry_read_sync(p->initiator, p->segment, p->local + kBytes / 2, addr_of(p->remote) + at, n));
  EXPECT_TRUE(matches(p->local + kBytes / 2, n, 2));
}

/* A notification with binary content (a NUL inside), drained on the peer. */
static void check_notifications(pair_t* p) {
  static const char message[] = {'k', 'v', '\0', 'x', (char)0xff};
  EXPECT_OK(ferry_notify_send(p->initiator, p->segment, "done", message, sizeof(message)));
  ferry_notifications_t* list = NULL;
  REQUIRE_OK(ferry_notify_drain(p->target, &list));
  size_t count = 0;
  EXPECT_OK(ferry_notifications_count(list, &count));
  EXPECT_TRUE(count == 1);
  if (count == 1) {
    const char *sender = NULL, *name = NULL, *initiator_id = NULL;
    const void* body = NULL;
    size_t body_len = 0;
    EXPECT_OK(ferry_notifications_get(list, 0, &sender, &name, &body, &body_len));
    EXPECT_OK(ferry_engine_peer_id(p->initiator, &initiator_id));
    EXPECT_TRUE(sender != NULL && initiator_id != NULL && strcmp(sender, initiator_id) == 0);
    EXPECT_TRUE(name != NULL && strcmp(name, "done") == 0);
    EXPECT_TRUE(body_len == sizeof(message) && memcmp(body, message, sizeof(message)) == 0);
    EXPECT_STATUS(ferry_notifications_get(list, 1, NULL, NULL, NULL, NULL), FERRY_INVALID_ARGUMENT,
                  "notification 1");
  }
  EXPECT_OK(ferry_notifications_free(list));
  /* Drained: the next drain is empty. */
  REQUIRE_OK(ferry_notify_drain(p->target, &list));
  EXPECT_OK(ferry_notifications_count(list, &count));
  EXPECT_TRUE(count == 0);
  EXPECT_OK(ferry_notifications_free(list));
}

/* Prepared lists (a strided local row, a plain remote one) and a prepared
 * write with a notification, posted twice; then a prepared read. */
static void check_prepared(pair_t* p) {
  const uint64_t remote_base = addr_of(p->remote) + kBytes / 2;
  const ferry_desc_row_t local_rows[] = {{addr_of(p->local), kPiece, 2 * kPiece, 4}};
  const ferry_desc_row_t remote_rows[] = {{remote_base, 4 * kPiece, 0, 1},
                                          {remote_base + 4 * kPiece, 4 * kPiece, 0, 1}};
  ferry_desc_list_t local = 0, remote = 0;
  REQUIRE_OK(ferry_list_prepare_local(p->initiator, local_rows, 1, &local));
  REQUIRE_OK(ferry_list_prepare_remote(p->initiator, p->segment, remote_rows, 2, &remote));
  size_t entries = 0;
  EXPECT_OK(ferry_list_entries(p->initiator, local, &entries));
  EXPECT_TRUE(entries == 4);
  EXPECT_OK(ferry_list_entries(p->initiator, remote, &entries));
  EXPECT_TRUE(entries == 2);

  /* Pairs must be equally long: the four 4 KiB local entries go to four
   * 4 KiB remote entries, in reverse order. */
  const ferry_desc_row_t remote_pieces[] = {{remote_base, kPiece, kPiece, 4}};
  ferry_desc_list_t pieces = 0;
  REQUIRE_OK(ferry_list_prepare_remote(p->initiator, p->segment, remote_pieces, 1, &pieces));
  const uint32_t li[] = {0, 1, 2, 3}, ri[] = {3, 2, 1, 0};
  for (int k = 0; k < 4; ++k) fill(p->local + k * 2 * kPiece, kPiece, 10u + (unsigned)k);
  ferry_xfer_t xfer = 0;
  REQUIRE_OK(ferry_xfer_make(p->initiator, FERRY_OP_WRITE, local, li, 4, pieces, ri, 4, "kv",
                             "ready", 5, &xfer));
  EXPECT_TRUE(xfer != 0);
  int32_t state = -1;
  EXPECT_STATUS(ferry_xfer_status(p->initiator, xfer, &state, NULL), FERRY_FAILED_PRECONDITION,
                "never posted");
  REQUIRE_OK(ferry_xfer_post(p->initiator, xfer, NULL, NULL, 0));
  REQUIRE_OK(ferry_xfer_wait(p->initiator, xfer, 120000));
  ferry_status_t xs = -1;
  EXPECT_OK(ferry_xfer_status(p->initiator, xfer, &state, &xs));
  EXPECT_TRUE(state == FERRY_STATE_COMPLETED && xs == FERRY_OK);
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(
        matches(p->remote + kBytes / 2 + (size_t)(3 - k) * kPiece, kPiece, 10u + (unsigned)k));
  }
  ferry_xfer_telemetry_t t;
  EXPECT_OK(ferry_xfer_telemetry(p->initiator, xfer, &t));
  EXPECT_TRUE(t.bytes == 4 * kPiece && t.entries >= 1 && t.entries <= 4);
  /* The notification arrived once the data was there. */
  ferry_notifications_t* list = NULL;
  size_t count = 0;
  const char* name = NULL;
  const void* body = NULL;
  size_t body_len = 0;
  if (EXPECT_OK(ferry_notify_drain(p->target, &list))) {
    EXPECT_OK(ferry_notifications_count(list, &count));
    EXPECT_TRUE(count == 1);
    if (count == 1) {
      EXPECT_OK(ferry_notifications_get(list, 0, NULL, &name, &body, &body_len));
      EXPECT_TRUE(strcmp(name, "kv") == 0 && body_len == 5 && memcmp(body, "ready", 5) == 0);
    }
    EXPECT_OK(ferry_notifications_free(list));
  }
  /* Posted again, with a notification of its own; an event loop's first
   * look, spinning longer than a post lives (it returns at the post's end,
   * its notification delivered: drained below). */
  for (int k = 0; k < 4; ++k) fill(p->local + k * 2 * kPiece, kPiece, 20u + (unsigned)k);
  REQUIRE_OK(ferry_xfer_post(p->initiator, xfer, "kv2", NULL, 0));
  state = -1;
  EXPECT_OK(ferry_xfer_spin(p->initiator, xfer, INT64_C(120000000), &state, &xs));
  EXPECT_TRUE(state == FERRY_STATE_COMPLETED && xs == FERRY_OK);
  EXPECT_OK(ferry_xfer_spin(p->initiator, xfer, -1, &state, NULL));
  EXPECT_TRUE(state == FERRY_STATE_COMPLETED);
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(
        matches(p->remote + kBytes / 2 + (size_t)(3 - k) * kPiece, kPiece, 20u + (unsigned)k));
  }
  if (EXPECT_OK(ferry_notify_drain(p->target, &list))) {
    EXPECT_OK(ferry_notifications_count(list, &count));
    EXPECT_TRUE(count == 1);
    if (count == 1) {
      EXPECT_OK(ferry_notifications_get(list, 0, NULL, &name, NULL, &body_len));
      EXPECT_TRUE(strcmp(name, "kv2") == 0 && body_len == 0);
    }
    EXPECT_OK(ferry_notifications_free(list));
  }
  EXPECT_OK(ferry_xfer_release(p->initiator, xfer));
  EXPECT_STATUS(ferry_xfer_wait(p->initiator, xfer, 0), FERRY_INVALID_ARGUMENT, "transfer");

  /* A prepared read of the same pieces, in order, into the local entries. */
  memset(p->local, 0, 8 * kPiece);
  REQUIRE_OK(ferry_xfer_make(p->initiator, FERRY_OP_READ, local, li, 4, pieces, li, 4, NULL, NULL,
                             0, &xfer));
  REQUIRE_OK(ferry_xfer_post(p->initiator, xfer, NULL, NULL, 0));
  EXPECT_OK(ferry_xfer_wait(p->initiator, xfer, 120000));
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(matches(p->local + (size_t)k * 2 * kPiece, kPiece, 20u + (unsigned)(3 - k)));
  }
  EXPECT_OK(ferry_xfer_release(p->initiator, xfer));

  /* Pairs of unequal lengths: the error names the pair. */
  EXPECT_STATUS(ferry_xfer_make(p->initiator, FERRY_OP_WRITE, local, li, 1, remote, li, 1, NULL,
                                NULL, 0, &xfer),
                FERRY_INVALID_ARGUMENT, "pair");
  EXPECT_OK(ferry_list_release(p->initiator, pieces));
  EXPECT_OK(ferry_list_release(p->initiator, remote));
  EXPECT_OK(ferry_list_release(p->initiator, local));
  EXPECT_STATUS(ferry_list_entries(p->initiator, local, &entries), FERRY_INVALID_ARGUMENT, "list");
}

/* The Prometheus text counts what was done. */
static void check_metrics(pair_t* p) {
  size_t len = 0;
  EXPECT_OK(ferry_metrics_text(p->initiator, NULL, 0, &len));
  EXPECT_TRUE(len > 0);
  char small[8];
  EXPECT_STATUS(ferry_metrics_text(p->initiator, small, sizeof(small), &len),
                FERRY_RESOURCE_EXHAUSTED, "8 bytes is too small");
  EXPECT_TRUE(strlen(small) == sizeof(small) - 1);
  const size_t cap = len + 65536;
  char* text = malloc(cap);
  EXPECT_TRUE(text != NULL);
  if (text == NULL) return;
  EXPECT_OK(ferry_metrics_text(p->initiator, text, cap, &len));
  EXPECT_TRUE(strlen(text) == len);
  EXPECT_TRUE(strstr(text, "ferry_requests_total") != NULL);
  EXPECT_TRUE(strstr(text, "ferry_notifications_sent_total") != NULL);
  free(text);
}

/* Failures with live engines: unregistered memory, unknown segments,
 * ranges the peer never registered, overlapping registrations. */
static void check_engine_errors(pair_t* p) {
  char* stray = malloc(kPiece);
  EXPECT_TRUE(stray != NULL);
  if (stray == NULL) return;
  /* Local memory never registered. */
  EXPECT_STATUS(ferry_write_sync(p->initiator, p->segment, stray, addr_of(p->remote), kPiece),
                FERRY_INVALID_ARGUMENT, "local buffer", "not inside a registered memory region");
  EXPECT_STATUS(ferry_memory_unregister(p->initiator, stray), FERRY_NOT_FOUND, "0x");
  /* Overlapping an existing registration. */
  EXPECT_STATUS(ferry_memory_register(p->initiator, p->local + 64, 128, NULL), FERRY_ALREADY_EXISTS,
                "overlaps");
  EXPECT_STATUS(ferry_memory_register(p->initiator, p->local, 0, NULL), FERRY_INVALID_ARGUMENT,
                "length");
  EXPECT_STATUS(ferry_memory_register(p->initiator, stray, kPiece, "floppy"),
                FERRY_INVALID_ARGUMENT, "floppy");
  /* A remote range outside every region of the peer: the peer refuses the
   * request, which fails; the batch's wait returns that failure. */
  ferry_request_t r = {FERRY_OP_WRITE, p->local, p->segment, addr_of(stray), kPiece};
  ferry_batch_t batch = 0;
  if (EXPECT_OK(ferry_batch_allocate(p->initiator, 1, &batch))) {
    EXPECT_OK(ferry_batch_submit(p->initiator, batch, &r, 1));
    EXPECT_STATUS(ferry_batch_wait(p->initiator, batch, 120000), FERRY_INVALID_ARGUMENT,
                  "request 0", "refused", "not inside a registered memory region");
    /* The queries succeed; the request's failure is their code and message. */
    int32_t state = -1;
    ferry_status_t request = FERRY_OK;
    EXPECT_TRUE(ferry_batch_request_status(p->initiator, batch, 0, &state, &request) == FERRY_OK);
    EXPECT_TRUE(state == FERRY_STATE_FAILED && request == FERRY_INVALID_ARGUMENT);
    EXPECT_TRUE(strstr(ferry_last_error(), "not inside a registered memory region") != NULL);
    ferry_batch_status_t summary;
    EXPECT_TRUE(ferry_batch_status(p->initiator, batch, &summary) == FERRY_OK);
    EXPECT_TRUE(summary.state == FERRY_STATE_FAILED && summary.failed == 1 &&
                summary.first_error == FERRY_INVALID_ARGUMENT);
    EXPECT_TRUE(strstr(ferry_last_error(), "not inside a registered memory region") != NULL);
    EXPECT_OK(ferry_batch_free(p->initiator, batch));
  }
  /* Unknown segments: made up, and closed. */
  EXPECT_STATUS(ferry_write_sync(p->initiator, 12345, p->local, addr_of(p->remote), kPiece),
                FERRY_INVALID_ARGUMENT, "segment");
  EXPECT_STATUS(ferry_segment_close(p->initiator, 0), FERRY_INVALID_ARGUMENT, "segment");
  ferry_segment_info_t* info = NULL;
  EXPECT_STATUS(ferry_segment_query(p->initiator, 777, &info), FERRY_INVALID_ARGUMENT, "segment");
  EXPECT_TRUE(info == NULL);
  /* A peer no engine listens on (port 1 of loopback), and a name that is
   * not "host:port" (no metadata store names peers here). */
  ferry_segment_t s = 99;
  ferry_status_t got = ferry_segment_open(p->initiator, "127.0.0.1:1", &s);
  EXPECT_TRUE(got == FERRY_UNAVAILABLE && s == 0 &&
              strstr(ferry_last_error(), "127.0.0.1:1") != NULL);
  EXPECT_STATUS(ferry_segment_open(p->initiator, "no-such-peer", &s), FERRY_INVALID_ARGUMENT,
                "no-such-peer", "host:port");
  /* Bad arguments of a batch. */
  EXPECT_STATUS(ferry_batch_allocate(p->initiator, 0, &batch), FERRY_INVALID_ARGUMENT, "capacity");
  ferry_request_t bad = {7, p->local, p->segment, addr_of(p->remote), kPiece};
  EXPECT_STATUS(ferry_transfer_sync(p->initiator, &bad, 1), FERRY_INVALID_ARGUMENT, "request 0",
                "opcode", "7");
  free(stray);
}

/* NULL handles and pointers: FERRY_INVALID_ARGUMENT naming the argument. */
static void check_null_arguments(pair_t* p) {
  ferry_options_t* o = NULL;
  ferry_engine_t* e = NULL;
  ferry_segment_t s = 0;
  ferry_batch_t b = 0;
  size_t n = 0;
  const char* str = NULL;
  EXPECT_STATUS(ferry_options_new(NULL), FERRY_INVALID_ARGUMENT, "out");
  EXPECT_STATUS(ferry_options_set(NULL, "transport", "tcp"), FERRY_INVALID_ARGUMENT, "opts");
  EXPECT_STATUS(ferry_options_get(NULL, "transport", NULL, 0, &n), FERRY_INVALID_ARGUMENT, "opts");
  EXPECT_STATUS(ferry_options_apply_environment(NULL), FERRY_INVALID_ARGUMENT, "opts");
  EXPECT_STATUS(ferry_engine_new(NULL, NULL), FERRY_INVALID_ARGUMENT, "out");
  EXPECT_STATUS(ferry_engine_peer_id(NULL, &str), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_engine_peer_id(p->target, NULL), FERRY_INVALID_ARGUMENT, "out");
  EXPECT_STATUS(ferry_engine_local_name(NULL, &str), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_engine_rpc_port(NULL, NULL), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_engine_option(NULL, "transport", NULL, 0, NULL), FERRY_INVALID_ARGUMENT,
                "engine");
  EXPECT_STATUS(ferry_memory_register(NULL, p->local, 1, NULL), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_memory_register(p->initiator, NULL, 1, NULL), FERRY_INVALID_ARGUMENT, "addr");
  EXPECT_STATUS(ferry_memory_unregister(NULL, p->local), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_segment_open(NULL, "127.0.0.1:1", &s), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_segment_open(p->initiator, NULL, &s), FERRY_INVALID_ARGUMENT, "peer");
  EXPECT_STATUS(ferry_segment_open(p->initiator, "127.0.0.1:1", NULL), FERRY_INVALID_ARGUMENT,
                "out");
  EXPECT_STATUS(ferry_segment_query(NULL, p->segment, NULL), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_segment_info_peer_id(NULL, &str), FERRY_INVALID_ARGUMENT, "info");
  EXPECT_STATUS(ferry_segment_info_region(NULL, 0, NULL, NULL, NULL), FERRY_INVALID_ARGUMENT,
                "info");
  EXPECT_STATUS(ferry_batch_allocate(NULL, 1, &b), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_batch_allocate(p->initiator, 1, NULL), FERRY_INVALID_ARGUMENT, "out");
  if (EXPECT_OK(ferry_batch_allocate(p->initiator, 1, &b))) {
    EXPECT_STATUS(ferry_batch_submit(p->initiator, b, NULL, 1), FERRY_INVALID_ARGUMENT, "requests");
    EXPECT_STATUS(ferry_batch_status(p->initiator, b, NULL), FERRY_INVALID_ARGUMENT, "out");
    EXPECT_STATUS(ferry_batch_request_status(p->initiator, b, 0, NULL, NULL),
                  FERRY_INVALID_ARGUMENT, "state");
    EXPECT_OK(ferry_batch_free(p->initiator, b));
  }
  EXPECT_STATUS(ferry_batch_wait(NULL, b, 0), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_batch_cancel(NULL, b), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_batch_free(NULL, b), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_transfer_sync(NULL, NULL, 0), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_transfer_sync(p->initiator, NULL, 2), FERRY_INVALID_ARGUMENT, "requests");
  EXPECT_STATUS(ferry_write_sync(p->initiator, p->segment, NULL, addr_of(p->remote), 1),
                FERRY_INVALID_ARGUMENT, "local");
  EXPECT_STATUS(ferry_read_sync(NULL, p->segment, p->local, addr_of(p->remote), 1),
                FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_notify_send(p->initiator, p->segment, NULL, "x", 1), FERRY_INVALID_ARGUMENT,
                "name");
  EXPECT_STATUS(ferry_notify_send(p->initiator, p->segment, "n", NULL, 3), FERRY_INVALID_ARGUMENT,
                "message");
  EXPECT_STATUS(ferry_notify_drain(NULL, NULL), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_notifications_count(NULL, &n), FERRY_INVALID_ARGUMENT, "list");
  EXPECT_STATUS(ferry_notifications_get(NULL, 0, NULL, NULL, NULL, NULL), FERRY_INVALID_ARGUMENT,
                "list");
  EXPECT_STATUS(ferry_list_prepare_local(p->initiator, NULL, 1, &b), FERRY_INVALID_ARGUMENT,
                "rows");
  EXPECT_STATUS(ferry_list_prepare_remote(NULL, p->segment, NULL, 0, &b), FERRY_INVALID_ARGUMENT,
                "engine");
  EXPECT_STATUS(ferry_list_entries(p->initiator, 1, NULL), FERRY_INVALID_ARGUMENT, "out");
  EXPECT_STATUS(ferry_list_release(NULL, 1), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(
      ferry_xfer_make(p->initiator, FERRY_OP_WRITE, 1, NULL, 1, 1, NULL, 1, NULL, NULL, 0, &b),
      FERRY_INVALID_ARGUMENT, "local_indices");
  EXPECT_STATUS(ferry_xfer_post(NULL, 1, NULL, NULL, 0), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_xfer_status(p->initiator, 1, NULL, NULL), FERRY_INVALID_ARGUMENT, "state");
  EXPECT_STATUS(ferry_xfer_wait(NULL, 1, 0), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_xfer_telemetry(p->initiator, 1, NULL), FERRY_INVALID_ARGUMENT, "out");
  EXPECT_STATUS(ferry_xfer_cancel(NULL, 1), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_xfer_release(NULL, 1), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_metrics_text(NULL, NULL, 0, NULL), FERRY_INVALID_ARGUMENT, "engine");
  EXPECT_STATUS(ferry_metrics_text(p->initiator, NULL, 5, NULL), FERRY_INVALID_ARGUMENT, "buf");
  EXPECT_STATUS(ferry_transport_check(NULL), FERRY_INVALID_ARGUMENT, "name");
  /* Freeing NULL is a no-op, as free(NULL) is. */
  EXPECT_OK(ferry_options_free(o));
  EXPECT_OK(ferry_engine_destroy(e));
  EXPECT_OK(ferry_segment_info_free(NULL));
  EXPECT_OK(ferry_notifications_free(NULL));
}

/* Shared memory (ferry_memory_allocate_shared, ferry_memory_register_shared)
 * as the target's memory: registered before the segment is opened, reached
 * over `transport` (over shm, through the initiator's own mapping), every
 * byte verified; then the refusals, each naming what was wrong. */
static void check_shared_memory(const char* transport) {
  ferry_options_t* o = make_options(transport);
  if (o == NULL) return;
  ferry_engine_t *initiator = NULL, *target = NULL;
  int ok = EXPECT_OK(ferry_engine_new(o, &target)) && EXPECT_OK(ferry_engine_new(o, &initiator));
  EXPECT_OK(ferry_options_free(o));
  char* local = calloc(kBytes, 1);
  void* shared = NULL;
  void* mapped = MAP_FAILED;
  int fd = memfd_create("c_api_test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_TRUE(local != NULL && fd >= 0);
  ok = ok && local != NULL && fd >= 0 && ftruncate(fd, 2 * kPiece) == 0 &&
       fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0;
  EXPECT_TRUE(ok);
  if (ok) mapped = mmap(NULL, 2 * kPiece, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_TRUE(mapped != MAP_FAILED);
  const char* peer = NULL;
  ferry_segment_t segment = 0;
  ok = ok && mapped != MAP_FAILED &&
       EXPECT_OK(ferry_memory_register(initiator, local, kBytes, "cpu")) &&
       EXPECT_OK(ferry_memory_allocate_shared(target, kBytes, NULL, 1, &shared)) &&
       /* The second page of the memfd's mapping: file offset kPiece. */
       EXPECT_OK(ferry_memory_register_shared(target, (char*)mapped + kPiece, kPiece, "cpu", fd,
                                              kPiece)) &&
       EXPECT_OK(ferry_engine_peer_id(target, &peer)) &&
       EXPECT_OK(ferry_segment_open(initiator, peer, &segment));
  if (ok) {
    char* s = shared;
    EXPECT_TRUE(s[0] == 0 && s[kBytes - 1] == 0); /* zero-filled */
    fill(local, kBytes, 21);
    EXPECT_OK(ferry_write_sync(initiator, segment, local, addr_of(shared), kBytes));
    EXPECT_TRUE(matches(shared, kBytes, 21));
    memset(local, 0, kBytes);
    EXPECT_OK(ferry_read_sync(initiator, segment, local, addr_of(shared), kBytes));
    EXPECT_TRUE(matches(local, kBytes, 21));
    fill(local, kPiece, 22);
    EXPECT_OK(ferry_write_sync(initiator, segment, local, addr_of((char*)mapped + kPiece), kPiece));
    EXPECT_TRUE(matches((char*)mapped + kPiece, kPiece, 22));
    /* Refusals. */
    void* none = &ok;
    EXPECT_STATUS(ferry_memory_allocate_shared(target, 0, NULL, 1, &none), FERRY_INVALID_ARGUMENT,
                  "0 bytes");
    EXPECT_TRUE(none == NULL);
    EXPECT_STATUS(ferry_memory_allocate_shared(target, kPiece, NULL, 1, NULL),
                  FERRY_INVALID_ARGUMENT, "ferry_memory_allocate_shared", "out");
    EXPECT_STATUS(ferry_memory_free_shared(target, local), FERRY_NOT_FOUND, "AllocateShared");
    EXPECT_STATUS(ferry_memory_free_shared(target, (char*)mapped + kPiece), FERRY_NOT_FOUND,
                  "AllocateShared"); /* shared, but registered, not allocated */
    int unsealed = memfd_create("c_api_test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_TRUE(unsealed >= 0 && ftruncate(unsealed, kPiece) == 0);
    void* m = mmap(NULL, kPiece, PROT_READ | PROT_WRITE, MAP_SHARED, unsealed, 0);
    EXPECT_TRUE(m != MAP_FAILED);
    if (m != MAP_FAILED) {
      EXPECT_STATUS(ferry_memory_register_shared(target, m, kPiece, "cpu", unsealed, 0),
                    FERRY_INVALID_ARGUMENT, "F_SEAL_SHRINK");
      munmap(m, kPiece);
    }
    if (unsealed >= 0) close(unsealed);
    /* The wrong file offset: the first page maps offset 0, not kPiece. */
    EXPECT_STATUS(ferry_memory_register_shared(target, mapped, kPiece, "cpu", fd, kPiece),
                  FERRY_INVALID_ARGUMENT, "file offset 0");
    EXPECT_OK(ferry_memory_unregister(target, (char*)mapped + kPiece));
    EXPECT_OK(ferry_memory_free_shared(target, shared));
    EXPECT_STATUS(ferry_memory_free_shared(target, shared), FERRY_NOT_FOUND, "AllocateShared");
  }
  EXPECT_OK(ferry_engine_destroy(initiator));
  EXPECT_OK(ferry_engine_destroy(target));
  if (fd >= 0) close(fd);
  if (mapped != MAP_FAILED) munmap(mapped, 2 * kPiece);
  free(local);
}

/* One transport end to end. */
static void run_transport(const char* transport) {
  ferry_status_t usable = ferry_transport_check(transport);
  if (usable == FERRY_FAILED_PRECONDITION) {
    /* As the C++ suites skip (tests/testing/same_host.h). */
    printf("c_api_test: %s skipped: %s\n", transport, ferry_last_error());
    return;
  }
  if (!EXPECT_OK(usable)) return;
  pair_t p;
  if (!pair_open(&p, transport)) return;
  char value[32];
  EXPECT_OK(ferry_engine_option(p.initiator, "transport", value, sizeof(value), NULL));
  EXPECT_TRUE(strcmp(value, transport) == 0);
  check_segment_info(&p, transport);
  /* The fd check first: the first transfer on this initiator, so no earlier
   * finish's write (which follows its visible state, see engine.h) can land
   * after the reset and count as a second wake-up. */
  check_completion_fd(&p);
  check_batch(&p);
  check_sync_helpers(&p);
  check_notifications(&p);
  check_prepared(&p);
  check_metrics(&p);
  check_engine_errors(&p);
  check_null_arguments(&p);
  check_shared_memory(transport);
  EXPECT_OK(ferry_segment_close(p.initiator, p.segment));
  EXPECT_STATUS(ferry_write_sync(p.initiator, p.segment, p.local, addr_of(p.remote), 1),
                FERRY_INVALID_ARGUMENT, "segment");
  pair_close(&p);
  printf("c_api_test: %s: done\n", transport);
}

/* Options by name: bad names and values leave the options as they were. */
static void check_options(void) {
  ferry_options_t* o = NULL;
  if (!EXPECT_OK(ferry_options_new(&o))) return;
  char value[64];
  size_t len = 0;
  EXPECT_OK(ferry_options_get(o, "tcp_streams", value, sizeof(value), &len));
  EXPECT_TRUE(strcmp(value, "2") == 0 && len == 1);
  EXPECT_OK(ferry_options_set(o, "tcp_streams", "4"));
  EXPECT_OK(ferry_options_get(o, "tcp_streams", value, sizeof(value), NULL));
  EXPECT_TRUE(strcmp(value, "4") == 0);

  /* An unknown name: named, with the closest known one suggested. */
  EXPECT_STATUS(ferry_options_set(o, "tcp_stream", "4"), FERRY_INVALID_ARGUMENT, "tcp_stream",
                "tcp_streams");
  EXPECT_STATUS(ferry_options_get(o, "no_such_option", value, sizeof(value), NULL),
                FERRY_INVALID_ARGUMENT, "no_such_option");
  /* Values out of range or not integers: the option, its range, the value. */
  EXPECT_STATUS(ferry_options_set(o, "tcp_streams", "0"), FERRY_INVALID_ARGUMENT, "tcp_streams",
                "[1, 64]", "0");
  EXPECT_STATUS(ferry_options_set(o, "tcp_streams", "many"), FERRY_INVALID_ARGUMENT, "tcp_streams",
                "many");
  EXPECT_STATUS(ferry_options_set(o, "transfer_timeout", ""), FERRY_INVALID_ARGUMENT,
                "transfer_timeout");
  /* A transport this build does not have: named, with those it has. */
  EXPECT_STATUS(ferry_options_set(o, "transport", "carrier_pigeon"), FERRY_INVALID_ARGUMENT,
                "carrier_pigeon", "tcp");
  EXPECT_OK(ferry_options_get(o, "tcp_streams", value, sizeof(value), NULL));
  EXPECT_TRUE(strcmp(value, "4") == 0);
  EXPECT_OK(ferry_options_get(o, "transport", value, sizeof(value), NULL));
  EXPECT_TRUE(strcmp(value, "auto") == 0);
  /* The buffer convention: a size query, then a buffer too small. */
  EXPECT_OK(ferry_options_get(o, "listen_host", NULL, 0, &len));
  EXPECT_TRUE(len == strlen("127.0.0.1"));
  EXPECT_STATUS(ferry_options_get(o, "listen_host", value, 4, &len), FERRY_RESOURCE_EXHAUSTED,
                "too small");
  EXPECT_TRUE(strcmp(value, "127") == 0 && len == strlen("127.0.0.1"));

  /* Bounds between options are the engine's to check. */
  EXPECT_OK(ferry_options_set(o, "slice_size", "1048576"));
  EXPECT_OK(ferry_options_set(o, "max_frame_bytes", "65536"));
  static char not_null;
  ferry_engine_t* e = (ferry_engine_t*)(void*)&not_null; /* set to NULL on failure */
  EXPECT_STATUS(ferry_engine_new(o, &e), FERRY_INVALID_ARGUMENT, "max_frame_bytes");
  EXPECT_TRUE(e == NULL);
  EXPECT_OK(ferry_options_free(o));

  EXPECT_STATUS(ferry_transport_check("carrier_pigeon"), FERRY_NOT_FOUND, "carrier_pigeon");
  EXPECT_OK(ferry_transport_check("tcp"));
}

/* The status names and the last error's per-thread reset. */
static void check_status_basics(void) {
  EXPECT_TRUE(strcmp(ferry_status_name(FERRY_OK), "OK") == 0);
  EXPECT_TRUE(strcmp(ferry_status_name(FERRY_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0);
  EXPECT_TRUE(strcmp(ferry_status_name(FERRY_UNAUTHENTICATED), "UNAUTHENTICATED") == 0);
  EXPECT_TRUE(strcmp(ferry_status_name(1000), "UNKNOWN") == 0);
  EXPECT_TRUE(ferry_version()[0] != '\0');
  EXPECT_STATUS(ferry_options_new(NULL), FERRY_INVALID_ARGUMENT, "ferry_options_new", "out");
  ferry_options_t* o = NULL;
  EXPECT_OK(ferry_options_new(&o)); /* clears the last error */
  EXPECT_OK(ferry_options_free(o));
}

int main(void) {
  check_status_basics();
  check_options();
  run_transport("tcp");
  run_transport("shm");
  if (g_failures > 0) {
    fprintf(stderr, "c_api_test: %d checks FAILED\n", g_failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
