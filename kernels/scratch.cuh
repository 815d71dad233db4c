// Carves one block of device scratch memory into aligned arrays. A launcher runs the same carving twice:
// over a null base to learn how many bytes to ask for, then over the block it was given.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gear {

class ScratchCarver {
 public:
  static constexpr size_t kAlign = 256;  // what cudaMalloc guarantees, and more than CUB asks for

  explicit ScratchCarver(void* base) : base_(static_cast<uint8_t*>(base)) {}

  template <typename T>
  T* Take(size_t count) {
    const size_t at = used_;
    used_ = (used_ + count * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + at);
  }

  size_t bytes() const { return used_; }

 private:
  uint8_t* base_;
  size_t used_ = 0;
};

}  // namespace gear
