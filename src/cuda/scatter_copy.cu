// The copy kernel of cuda::CopyQueue: many copies between GPU memory in one
// launch, where the driver's copies (cuMemcpyAsync, cuMemcpyBatchAsync)
// cost some microseconds each on the GPU (H200: about 5 us per 32 KiB copy,
// 6 GB/s for the KV page-16 preset). Ferry never compiles this file: its
// PTX is in scatter_copy_ptx.inc (scripts/gen-scatter-copy-ptx.sh makes it
// with nvcc), and the CUDA driver compiles that for the GPU at run time, so
// Ferry builds without a CUDA toolkit.
//
// Each block takes tasks blockIdx.x, blockIdx.x + gridDim.x, ...; a task is
// at most CopyQueue::kTaskBytes. The task list is in page-locked host memory
// (read once per task by one thread). 16-byte aligned tasks move in 16-byte
// words, four loads in flight per thread; others byte by byte.

// One task: len bytes from src to dst. The layout is cuda::KernelTask's.
struct FerryCopyTask {
  const unsigned char* src;
  unsigned char* dst;
  unsigned long long len;
};

extern "C" __global__ void __launch_bounds__(256)
    ferry_scatter_copy(const FerryCopyTask* tasks, unsigned long long n) {
  __shared__ FerryCopyTask task;
  for (unsigned long long t = blockIdx.x; t < n; t += gridDim.x) {
    if (threadIdx.x == 0) task = tasks[t];
    __syncthreads();
    const unsigned char* src = task.src;
    unsigned char* dst = task.dst;
    const unsigned long long len = task.len;
    __syncthreads();  // (thread 0 overwrites `task` next round)
    if ((((unsigned long long)src | (unsigned long long)dst | len) & 15) == 0) {
      const uint4* s = reinterpret_cast<const uint4*>(src);
      uint4* d = reinterpret_cast<uint4*>(dst);
      const unsigned long long words = len >> 4;
      const unsigned stride = blockDim.x;
      unsigned long long i = threadIdx.x;
      for (; i + 3 * stride < words; i += 4 * stride) {
        const uint4 a = s[i], b = s[i + stride], c = s[i + 2 * stride], e = s[i + 3 * stride];
        d[i] = a;
        d[i + stride] = b;
        d[i + 2 * stride] = c;
        d[i + 3 * stride] = e;
      }
      for (; i < words; i += stride) d[i] = s[i];
    } else {
      for (unsigned long long i = threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
    }
  }
}
