// Staging: GPU memory of this engine over transports that reach only host
// memory (shm, fabric, tcp), through page-locked host buffers.
//
// WithStaging wraps such a transport: routes whose local memory is GPU
// memory and whose remote memory is host memory take it too. Each such slice
// (at most the inner transport's slice size) gets a page-locked buffer of
// the link's pool (8 of them): a write copies the slice from the device into
// it (CopyQueue: a stream and events), then posts the inner slice from the
// buffer; a read posts the inner slice into the buffer, then copies it to
// the device (only while the batch may still land data: a cancelled read
// never reaches GPU memory). With several buffers in flight, copying chunk k
// to or from the device overlaps moving chunk k-1 on the network. Slices of
// host memory go straight to the inner link. A slice waits for a buffer at
// most until its deadline.
//
// Notifications (Notify) and Flush first wait for every staged write posted
// before them, so they still follow those writes. GPU memory on the peer's
// side is not staged here (the target would have to stage it): those routes
// need cuda_ipc.
#pragma once

#include <memory>
#include <string>

#include "base/target.h"
#include "base/transport.h"

namespace ferry::internal {

// `cuda_driver`: the library to load (EngineOptions::testing.cuda_driver),
// "" for libcuda.so.1 once the process has loaded it.
std::unique_ptr<Transport> WithStaging(std::unique_ptr<Transport> inner,
                                       std::shared_ptr<EngineTarget> self, std::string cuda_driver);

}  // namespace ferry::internal
