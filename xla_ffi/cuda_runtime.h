// The CUDA side of a table: its memory registered with CUDA (pinned, and mapped into the address space
// of every device), and the per-device view the kernels read it through. Part of CUDA builds only
// (GEAR_JAX_WITH_CUDA). In a process that sees no usable GPU, nothing is registered and the table works
// exactly as in a CPU-only build.
//
// Plain C++ (no CUDA headers), so that table_mapping.cc and module.cc include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/table_view.h"

namespace gear {

struct DeviceError;

// CUDA devices this process can use: 0 without a driver or a GPU, or where CUDA cannot start (say, in a
// child forked after its parent started CUDA).
int CudaDeviceCount();

// What a device can do with host memory, from cudaDeviceGetAttribute.
struct CudaDeviceInfo {
  std::string name;
  int compute_capability = 0;        // major * 10 + minor
  bool host_native_atomics = false;  // cudaDevAttrHostNativeAtomicSupported: a kernel's atomics on host
                                     // memory are atomic against the CPU's (NVLink-C2C hosts, not PCIe)
  bool pageable_memory_access = false;
  bool host_register_supported = false;
};
// Describes `device`; false with *error set when CUDA cannot say.
bool DescribeCudaDevice(int device, CudaDeviceInfo* info, std::string* error);
// Whether kernels on `device` may update table memory with atomics that the CPU's writers respect
// (cached per device; false when unknown).
bool HostNativeAtomics(int device);

class IndexMemory;  // kernels/priority_index.h
// Memory for a GPU's priority index: pinned host memory, mapped for every device (cudaHostAlloc). Throws
// std::bad_alloc when CUDA cannot allocate it.
std::unique_ptr<IndexMemory> MappedIndexMemory();

class CudaPinning {
 public:
  // Registers `bytes` at `base` (cudaHostRegister, mapped and portable) when `want` is set and the
  // process sees a CUDA device. Never fails: unasked, without a device, or when registering fails, the
  // result is unpinned and reason() says why.
  static std::unique_ptr<CudaPinning> Pin(uint8_t* base, size_t bytes, bool want);
  // Waits for the kernels of every device that used the table, then unregisters; the caller unmaps after.
  ~CudaPinning();
  CudaPinning(const CudaPinning&) = delete;
  CudaPinning& operator=(const CudaPinning&) = delete;

  bool pinned() const { return pinned_; }
  const std::string& reason() const { return reason_; }

  // Before the memory holds another table: waits for the kernels of every device that used it, clears
  // the error records and forgets the device views (they follow the old table's layout). Callers make
  // sure no handler still works on the old table (nothing else holds a DeviceSide then).
  void Quiesce();
  // Waits for the kernels of every device that used the memory (nothing else changes).
  void WaitForKernels();

  // What kernels on one device use: the table's view through the device's mapping, and the record of
  // data errors of this table on this device (pinned host memory: host and device address).
  struct DeviceSide {
    TableView view;
    DeviceError* error_host;
    DeviceError* error_device;
  };
  // The device side for `device` (the current CUDA device), set up on first use. nullptr with *error
  // set when the table is not pinned or the device cannot map it.
  const DeviceSide* ForDevice(int device, const TableView& host_view, std::string* error);

 private:
  static constexpr int kMaxDevices = 64;

  CudaPinning(uint8_t* base, std::string reason) : base_(base), reason_(std::move(reason)) {}

  uint8_t* base_;
  std::string reason_;
  bool pinned_ = false;
  DeviceError* errors_ = nullptr;  // [kMaxDevices] when pinned: cudaHostAlloc'ed, mapped and portable
  std::mutex mutex_;
  std::unique_ptr<DeviceSide> sides_[kMaxDevices];
  void SynchronizeDevicesUsed();
};

}  // namespace gear
