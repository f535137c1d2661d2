// File staging: this engine's file regions as the local side of requests
// over the stream transports (tcp, shm), which move bytes between a peer and
// host memory of this process.
//
// WithFileStaging wraps such a transport: routes whose local memory is one
// of this engine's file regions take it too. Each such slice gets a host
// buffer of its own (page-aligned, so the file I/O may use O_DIRECT; carved
// from the transport's huge-page slabs, base/staging_pool.h):
//   - a write (file → peer) reads the file range into the buffer through the
//     engine's ring (storage::FileIo), then posts the inner slice from it;
//   - a read (peer → file) posts the inner slice into the buffer, then writes
//     the buffer to the file through the ring, only while the batch may still
//     land data (FileOp::landing): once CancelBatch returns no byte of a
//     cancelled read reaches the file.
// At most kMaxStagedBytes of slices hold buffers at once per transport; the
// others wait in order (a slice that waits past its deadline fails
// kDeadlineExceeded). Inner posts run on the transport's worker thread, never
// on the ring's reaping thread or another transport's completion threads;
// the slices ready at once are posted together (one inner batch per link and
// deadline), so the link frames them as it frames memory slices.
// Notify and Flush first wait for the staged writes posted before them, so a
// notification still follows the data. Slices of memory go straight to the
// inner link.
#pragma once

#include <memory>

#include "base/target.h"
#include "base/transport.h"

namespace ferry::internal::storage {

std::unique_ptr<Transport> WithFileStaging(std::unique_ptr<Transport> inner,
                                           std::shared_ptr<EngineTarget> self);

}  // namespace ferry::internal::storage
