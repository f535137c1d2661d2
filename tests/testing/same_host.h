// Tests that need the shm transport skip, saying why, where this machine
// refuses same-host copies (see src/transport/shm/same_host_probe.h); the tests of
// the fallback to tcp still run there.
#pragma once

#include <string>

#include "transport/shm/same_host_probe.h"

namespace ferry::test {

// "" if same-host copies work here (probed once per process), else the reason.
inline const std::string& SameHostCopyRefusal() {
  static const std::string refusal = ::ferry::internal::shm::SameHostCopyRefusal();
  return refusal;
}

}  // namespace ferry::test

// Skips the current test when shm cannot work on this machine.
#define FERRY_SKIP_WITHOUT_SAME_HOST_COPY()                                            \
  do {                                                                                 \
    const std::string& why = ::ferry::test::SameHostCopyRefusal();                     \
    if (!why.empty()) GTEST_SKIP() << "same-host copies refused here (" << why << ")"; \
  } while (0)
