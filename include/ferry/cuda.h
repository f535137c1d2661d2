// What this process finds of CUDA. Ferry loads the CUDA driver
// (libcuda.so.1) at run time and needs no CUDA to build or run; GPU memory
// ("cuda:N" regions) is checked against it and moved with it
// (docs/architecture.md, "Memory kinds: cuda").
#pragma once

#include <string>
#include <vector>

#include "ferry/export.h"

namespace ferry {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
};

struct CudaInfo {
  std::string library;           // "libcuda.so.1"
  bool loaded = false;           // the library loaded with every entry point Ferry uses
  bool available = false;        // and cuInit succeeded
  std::string why_unavailable;   // "" when available
  bool data_path = false;        // available, with every entry point the GPU data paths call
  std::string why_no_data_path;  // "" when data_path
  int driver_version = 0;        // cuDriverGetVersion (13000 = 13.0); 0 if not loaded
  std::vector<CudaDeviceInfo> devices;
  std::string error;  // a query that failed after the driver loaded, or ""
};

// Loads the driver the first time (as registrations of "cuda:N" do) and
// lists its devices.
FERRY_API CudaInfo DescribeCuda();

}  // namespace ferry
