#include "parallel.h"

namespace gear {
namespace {

class Serial : public ParallelFor {
 public:
  void Run(int64_t n, int64_t /*grain*/, const std::function<void(int64_t, int64_t)>& body) const override {
    if (n > 0) body(0, n);
  }
};

}  // namespace

const ParallelFor& SerialFor() {
  static const Serial serial;
  return serial;
}

}  // namespace gear
