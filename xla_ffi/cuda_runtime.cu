#include "xla_ffi/cuda_runtime.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

#include "kernels/device_error.cuh"
#include "kernels/priority_index.h"

namespace gear {
namespace {

// Describes a failed CUDA call and clears the runtime's last error, so that a later launch check does
// not report it again.
std::string Failed(const char* call, cudaError_t status) {
  cudaGetLastError();
  return std::string(call) + " failed: " + cudaGetErrorString(status);
}

// The same byte of the mapping, seen from a device.
template <typename T>
T* Rebase(T* host, const uint8_t* host_base, uint8_t* device_base) {
  return reinterpret_cast<T*>(device_base + (reinterpret_cast<const uint8_t*>(host) - host_base));
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error here, and not one for a later launch check
    return 0;
  }
  return count;
}

bool DescribeCudaDevice(int device, CudaDeviceInfo* info, std::string* error) {
  cudaDeviceProp prop{};
  cudaError_t status = cudaGetDeviceProperties(&prop, device);
  int atomics = 0, pageable = 0, major = 0, minor = 0;
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&atomics, cudaDevAttrHostNativeAtomicSupported, device);
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device);
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (status != cudaSuccess) {
    *error = Failed("cudaDeviceGetAttribute", status) + " for CUDA device " + std::to_string(device);
    return false;
  }
  int registered = 0;
  if (cudaDeviceGetAttribute(&registered, cudaDevAttrHostRegisterSupported, device) != cudaSuccess) {
    cudaGetLastError();
    registered = 0;
  }
  info->name = prop.name;
  info->compute_capability = major * 10 + minor;
  info->host_native_atomics = atomics != 0;
  info->pageable_memory_access = pageable != 0;
  info->host_register_supported = registered != 0;
  return true;
}

bool HostNativeAtomics(int device) {
  static constexpr int kUnknown = -1;
  static std::atomic<int> cached[64] = {};
  static std::once_flag init;
  std::call_once(init, [] {
    for (auto& c : cached) c.store(kUnknown, std::memory_order_relaxed);
  });
  if (device < 0 || device >= 64) return false;
  int value = cached[device].load(std::memory_order_relaxed);
  if (value == kUnknown) {
    int atomics = 0;
    if (cudaDeviceGetAttribute(&atomics, cudaDevAttrHostNativeAtomicSupported, device) != cudaSuccess) {
      cudaGetLastError();
      atomics = 0;
    }
    value = atomics != 0 ? 1 : 0;
    cached[device].store(value, std::memory_order_relaxed);
  }
  return value == 1;
}

std::unique_ptr<CudaPinning> CudaPinning::Pin(uint8_t* base, size_t bytes, bool want) {
  if (!want) {
    return std::unique_ptr<CudaPinning>(new CudaPinning(base, "not asked to pin (pin=False)"));
  }
  if (CudaDeviceCount() == 0) {
    return std::unique_ptr<CudaPinning>(new CudaPinning(base, "this process sees no CUDA device"));
  }
  cudaError_t status = cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (status != cudaSuccess) {
    return std::unique_ptr<CudaPinning>(new CudaPinning(
        base,
        Failed("cudaHostRegister", status) + " (" + std::to_string(bytes) + " bytes of shared memory)"));
  }
  void* errors = nullptr;
  status =
      cudaHostAlloc(&errors, kMaxDevices * sizeof(DeviceError), cudaHostAllocMapped | cudaHostAllocPortable);
  if (status != cudaSuccess) {
    std::string reason = Failed("cudaHostAlloc", status);
    cudaHostUnregister(base);
    cudaGetLastError();
    return std::unique_ptr<CudaPinning>(new CudaPinning(base, std::move(reason)));
  }
  std::memset(errors, 0, kMaxDevices * sizeof(DeviceError));
  std::unique_ptr<CudaPinning> pinning(new CudaPinning(base, ""));
  pinning->pinned_ = true;
  pinning->errors_ = static_cast<DeviceError*>(errors);
  return pinning;
}

namespace {

class MappedMemory : public IndexMemory {
 public:
  void* Allocate(size_t bytes) override {
    void* data = nullptr;
    if (cudaHostAlloc(&data, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    void* device = nullptr;
    if (cudaHostGetDevicePointer(&device, data, 0) != cudaSuccess) {
      cudaGetLastError();
      cudaFreeHost(data);
      throw std::bad_alloc();
    }
    std::memset(data, 0, bytes);
    host_ = static_cast<uint8_t*>(data);
    device_ = static_cast<uint8_t*>(device);
    allocated_by_pid_ = getpid();
    return data;
  }
  void Free(void* data, size_t) override {
    if (getpid() == allocated_by_pid_) cudaFreeHost(data);  // a forked child makes no CUDA call
    cudaGetLastError();
  }
  const void* DeviceAddress(const void* host) const override {
    return device_ + (static_cast<const uint8_t*>(host) - host_);
  }

 private:
  uint8_t* host_ = nullptr;
  uint8_t* device_ = nullptr;
  pid_t allocated_by_pid_ = 0;
};

}  // namespace

std::unique_ptr<IndexMemory> MappedIndexMemory() { return std::make_unique<MappedMemory>(); }

void CudaPinning::SynchronizeDevicesUsed() {
  int current = 0;
  const bool restore = cudaGetDevice(&current) == cudaSuccess;
  for (int device = 0; device < kMaxDevices; ++device) {
    if (sides_[device] && cudaSetDevice(device) == cudaSuccess) cudaDeviceSynchronize();
  }
  if (restore) cudaSetDevice(current);
  cudaGetLastError();
}

void CudaPinning::WaitForKernels() {
  if (!pinned_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  SynchronizeDevicesUsed();
}

void CudaPinning::Quiesce() {
  if (!pinned_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  SynchronizeDevicesUsed();
  std::memset(errors_, 0, kMaxDevices * sizeof(DeviceError));
  // The devices that used the memory are synchronized above; forgetting them keeps nothing pending.
  for (auto& side : sides_) side.reset();
}

CudaPinning::~CudaPinning() {
  if (!pinned_) return;
  // Kernels that earlier calls enqueued may still read the memory: wait for every device that used it.
  SynchronizeDevicesUsed();
  cudaFreeHost(errors_);
  cudaHostUnregister(base_);
  cudaGetLastError();  // failures here (CUDA already shut down at exit) leave nothing to undo
}

const CudaPinning::DeviceSide* CudaPinning::ForDevice(int device, const TableView& host_view,
                                                      std::string* error) {
  if (!pinned_) {
    *error = "its memory is not registered with CUDA: " + reason_;
    return nullptr;
  }
  if (device < 0 || device >= kMaxDevices) {
    *error = "CUDA device " + std::to_string(device) + " is outside the " + std::to_string(kMaxDevices) +
             " devices gear_jax supports";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (sides_[device]) return sides_[device].get();
  void* table = nullptr;
  void* errors = nullptr;
  cudaError_t status = cudaHostGetDevicePointer(&table, base_, 0);
  if (status == cudaSuccess) status = cudaHostGetDevicePointer(&errors, errors_, 0);
  if (status != cudaSuccess) {
    *error = Failed("cudaHostGetDevicePointer", status) + " on CUDA device " + std::to_string(device);
    return nullptr;
  }
  auto side = std::make_unique<DeviceSide>();
  uint8_t* device_base = static_cast<uint8_t*>(table);
  TableView& view = side->view;
  view = host_view;
  view.state = Rebase(host_view.state, base_, device_base);
  view.length = Rebase(host_view.length, base_, device_base);
  view.insert_seq = Rebase(host_view.insert_seq, base_, device_base);
  view.times_sampled = Rebase(host_view.times_sampled, base_, device_base);
  view.next_seq = Rebase(host_view.next_seq, base_, device_base);
  view.selectable = Rebase(host_view.selectable, base_, device_base);
  view.max_priority_bits = Rebase(host_view.max_priority_bits, base_, device_base);
  view.read_modify_write_atomics = HostNativeAtomics(device);
  for (int32_t f = 0; f < view.num_fields; ++f) {
    view.fields[f].data = Rebase(host_view.fields[f].data, base_, device_base);
  }
  side->error_host = errors_ + device;
  side->error_device = static_cast<DeviceError*>(errors) + device;
  sides_[device] = std::move(side);
  return sides_[device].get();
}

}  // namespace gear
