#pragma once

#include <cstdint>
#include <string_view>

#include "ferry/export.h"

namespace ferry {

// Semantic version of this build, e.g. "0.1.0".
FERRY_API std::string_view Version();

// Wire protocol versions this build speaks (see docs/wire-format.md).
inline constexpr uint16_t kWireVersionMin = 1;
inline constexpr uint16_t kWireVersionMax = 1;

}  // namespace ferry
