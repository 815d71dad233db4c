#include "xla_ffi/host_staging.h"

#include <algorithm>
#include <memory>

namespace gear {
namespace {

constexpr int kMaxDevices = 64;

int BitWidth(size_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(static_cast<unsigned long long>(v)); }

}  // namespace

HostStaging* HostStaging::ForDevice(int device) {
  static HostStaging* const pools =
      new HostStaging[kMaxDevices];  // never destroyed: handlers may run during exit
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return &pools[device];
}

cudaError_t HostStaging::Acquire(size_t bytes, Chunk** chunk) {
  const int size_class = bytes <= 1 ? 0 : std::max(BitWidth(bytes - 1) - kMinBits, 0);
  if (size_class >= kClasses) return cudaErrorMemoryAllocation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Chunk*>& released = released_[size_class];
    for (auto it = released.begin(); it != released.end(); ++it) {
      const cudaError_t status = cudaEventQuery((*it)->released);
      if (status == cudaSuccess) {
        *chunk = *it;
        released.erase(it);
        return cudaSuccess;
      }
      // cudaErrorNotReady (still in use) is no failure, and a broken context fails the next launch
      // anyway: either way the status must not reach a later launch check as its own.
      cudaGetLastError();
    }
  }
  // Every chunk of the class is in flight: make one more (outside the lock, cudaHostAlloc is slow).
  auto fresh = std::make_unique<Chunk>();
  fresh->bytes = size_t{1} << (kMinBits + size_class);
  fresh->size_class = size_class;
  cudaError_t status = cudaHostAlloc(&fresh->data, fresh->bytes, cudaHostAllocPortable);
  if (status == cudaSuccess) {
    status = cudaEventCreateWithFlags(&fresh->released, cudaEventDisableTiming);
    if (status != cudaSuccess) cudaFreeHost(fresh->data);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    return status;
  }
  *chunk = fresh.release();
  return cudaSuccess;
}

cudaError_t HostStaging::Release(Chunk* chunk, cudaStream_t stream) {
  const cudaError_t status = cudaEventRecord(chunk->released, stream);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return status;  // the chunk is leaked: nothing tells when the stream is done with it
  }
  std::lock_guard<std::mutex> lock(mutex_);
  released_[chunk->size_class].push_back(chunk);
  return cudaSuccess;
}

}  // namespace gear
