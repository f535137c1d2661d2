/* The C API's basic example: two engines in one process over loopback tcp,
 * one registered buffer each, a batched write and a synchronous read back,
 * every call's status checked. Built and run as a test (label example).
 *
 *   cc -std=c11 basic.c -lferry ...   (see tests/c_api/CMakeLists.txt)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry_c.h"

/* Prints the failed call, its status and the thread's last error; exits. */
static void check(ferry_status_t status, const char* what) {
  if (status == FERRY_OK) return;
  fprintf(stderr, "%s failed: %s: %s\n", what, ferry_status_name(status), ferry_last_error());
  exit(1);
}

enum { kBufferBytes = 1 << 20, kPiece = 4096, kPieces = 4 };

int main(void) {
  /* Options by name and text value, as in docs/configuration.md. */
  ferry_options_t* options = NULL;
  check(ferry_options_new(&options), "ferry_options_new");
  check(ferry_options_set(options, "transport", "tcp"), "setting transport");
  check(ferry_options_set(options, "transfer_timeout", "30000"), "setting transfer_timeout");

  ferry_engine_t* target = NULL;
  ferry_engine_t* initiator = NULL;
  check(ferry_engine_new(options, &target), "creating the target engine");
  check(ferry_engine_new(options, &initiator), "creating the initiator engine");
  check(ferry_options_free(options), "ferry_options_free"); /* the engines copied them */

  char* remote = calloc(kBufferBytes, 1);
  char* local = calloc(kBufferBytes, 1);
  if (remote == NULL || local == NULL) return 1;
  check(ferry_memory_register(target, remote, kBufferBytes, "cpu"), "registering remote");
  check(ferry_memory_register(initiator, local, kBufferBytes, "cpu"), "registering local");
  memset(local, 'x', kPieces * kPiece);

  /* Peers name each other "host:port"; remote addresses are the peer's own. */
  const char* target_id = NULL;
  check(ferry_engine_peer_id(target, &target_id), "ferry_engine_peer_id");
  ferry_segment_t segment = 0;
  check(ferry_segment_open(initiator, target_id, &segment), "opening the target's segment");

  /* A batch of four writes, each 4 KiB to every other 4 KiB of the target. */
  ferry_request_t writes[kPieces];
  for (int i = 0; i < kPieces; ++i) {
    writes[i].opcode = FERRY_OP_WRITE;
    writes[i].local = local + i * kPiece;
    writes[i].segment = segment;
    writes[i].remote_addr = (uint64_t)(uintptr_t)remote + (uint64_t)i * 2 * kPiece;
    writes[i].length = kPiece;
  }
  ferry_batch_t batch = 0;
  check(ferry_batch_allocate(initiator, kPieces, &batch), "ferry_batch_allocate");
  check(ferry_batch_submit(initiator, batch, writes, kPieces), "ferry_batch_submit");
  check(ferry_batch_wait(initiator, batch, 30000), "ferry_batch_wait");
  check(ferry_batch_free(initiator, batch), "ferry_batch_free");
  for (int i = 0; i < kPieces; ++i) {
    if (memcmp(remote + i * 2 * kPiece, local + i * kPiece, kPiece) != 0) {
      fprintf(stderr, "write %d did not land\n", i);
      return 1;
    }
  }

  /* A synchronous read of what was just written, into another place. */
  char* back = local + kBufferBytes / 2;
  check(ferry_read_sync(initiator, segment, back, (uint64_t)(uintptr_t)remote + 2 * kPiece, kPiece),
        "ferry_read_sync");
  if (memcmp(back, local + kPiece, kPiece) != 0) {
    fprintf(stderr, "the read back differs from what was written\n");
    return 1;
  }

  ferry_segment_info_t* info = NULL;
  const char* transport = NULL;
  check(ferry_segment_query(initiator, segment, &info), "ferry_segment_query");
  check(ferry_segment_info_transport(info, &transport), "ferry_segment_info_transport");
  printf("ok: wrote %d x %d bytes to %s over %s and read one back\n", kPieces, kPiece, target_id,
         transport);
  check(ferry_segment_info_free(info), "ferry_segment_info_free");

  check(ferry_segment_close(initiator, segment), "ferry_segment_close");
  check(ferry_memory_unregister(initiator, local), "unregistering local");
  check(ferry_memory_unregister(target, remote), "unregistering remote");
  check(ferry_engine_destroy(initiator), "destroying the initiator");
  check(ferry_engine_destroy(target), "destroying the target");
  free(local);
  free(remote);
  return 0;
}
