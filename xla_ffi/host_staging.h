// Pinned host memory for stream-ordered host work: the staging areas that the CUDA handlers copy
// device buffers into, hand to a host callback on the same stream, and copy results back out of
// (xla_ffi/cuda_handlers.cu, the priority scatter on hosts without native host atomics).
//
// A handler never waits for its stream, so it cannot free such memory itself: the stream may still be
// copying into it. Release records an event on the stream after the last work that touches the chunk,
// and Acquire hands a chunk out again only once its event has completed (cudaEventQuery, never a wait).
// Chunks come in power-of-two size classes with one free list each, and are kept rather than freed, so
// a pool holds at most as many chunks per class as calls were in flight at once; the memory is the
// process's until it exits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <vector>

namespace gear {

class HostStaging {
 public:
  struct Chunk {
    void* data;    // pinned host memory (cudaHostAlloc, portable: every device can copy it)
    size_t bytes;  // at least what Acquire was asked for
    int size_class;
    cudaEvent_t released;  // recorded on the stream after the last work of its latest user
  };

  // The pool of `device`, which must be the calling thread's current device whenever the pool is used:
  // a chunk's event belongs to the device it was made on, and is only recorded on that device's streams.
  // nullptr for a device outside [0, 64). Pools are never destroyed: handlers may run during exit.
  static HostStaging* ForDevice(int device);

  // A chunk of at least `bytes` bytes that no stream uses any more. Thread-safe. Fails with the CUDA
  // status of a failed allocation; the runtime's last error is cleared then.
  cudaError_t Acquire(size_t bytes, Chunk** chunk);

  // Gives `chunk` back once `stream` has passed the work enqueued on it so far, the caller's last use of
  // the chunk. Thread-safe. If the event cannot be recorded, the chunk is never handed out again (the
  // stream may still write to it) and the status is returned, with the runtime's last error cleared.
  cudaError_t Release(Chunk* chunk, cudaStream_t stream);

  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

 private:
  static constexpr int kMinBits = 12;  // the smallest class: one page, what cudaHostAlloc hands out anyway
  static constexpr int kClasses = 64 - kMinBits;

  HostStaging() = default;

  std::mutex mutex_;
  std::vector<Chunk*> released_[kClasses];  // per class, in the order they were released
};

}  // namespace gear
