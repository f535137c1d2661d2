// One libFuzzer binary per target: FERRY_FUZZ_RUN is the target's function
// (fuzz_targets.h), set by CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::fuzz::FERRY_FUZZ_RUN(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
