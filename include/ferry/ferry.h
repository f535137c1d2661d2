// Umbrella header: everything in the public C++ API.
#pragma once

#include "ferry/cuda.h"
#include "ferry/engine.h"
#include "ferry/limits.h"
#include "ferry/metadata.h"
#include "ferry/options.h"
#include "ferry/status.h"
#include "ferry/transports.h"
#include "ferry/types.h"
#include "ferry/version.h"
