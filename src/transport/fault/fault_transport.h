// A fault-injecting decorator for any transport: the engine's TransportSet
// wraps every transport in it when EngineOptions::testing.link_faults has a
// seed, so the same faults reach local, shm and tcp links alike (and any
// later transport) without touching them. Its links decide per slice, from
// one seeded generator in posting order, whether the slice
//   passes, fails at once (kUnavailable), is dropped (its reply never comes:
//   kDeadlineExceeded at its deadline), is answered late, is answered out of
//   order with the others of its post, or is answered with a corrupted
//   status (a success reported as kDataLoss); a read may also fail
//   kDeadlineExceeded at once and still move later (late_read_percent: the
//   fabric provider's read past its deadline), before the link's next post.
// Every slice still completes exactly once. Messages say "fault injected".
// Thread-safe.
#pragma once

#include <memory>

#include "base/transport.h"
#include "ferry/options.h"

namespace ferry::internal {

std::unique_ptr<Transport> WithFaults(std::unique_ptr<Transport> inner,
                                      const EngineOptions::Testing::LinkFaults& f);

}  // namespace ferry::internal
