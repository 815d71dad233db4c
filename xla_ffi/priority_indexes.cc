#include "xla_ffi/priority_indexes.h"

#include <cstring>

namespace gear {
namespace {

bool SameExponent(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

}  // namespace

PriorityIndexes::Held PriorityIndexes::ForCpu(const TableView& table, float exponent) {
  std::shared_ptr<IndexSlot> slot;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    ++uses_;
    int cpu_entries = 0;
    for (Entry& e : entries_) {
      if (e.place != kCpu) continue;
      ++cpu_entries;
      if (SameExponent(e.exponent, exponent)) {
        e.last_use = uses_;
        slot = e.slot;
      }
    }
    if (slot == nullptr) {
      if (cpu_entries >= kMaxCpuIndexes) {  // the least recently used CPU index gives way
        auto oldest = entries_.end();
        for (auto it = entries_.begin(); it != entries_.end(); ++it) {
          if (it->place == kCpu && (oldest == entries_.end() || it->last_use < oldest->last_use)) oldest = it;
        }
        entries_.erase(oldest);  // a call still using it keeps it alive until it is done
      }
      slot = std::make_shared<IndexSlot>();
      slot->index = std::make_unique<PriorityIndex>(table.capacity, exponent, PlainIndexMemory());
      entries_.push_back(Entry{kCpu, exponent, slot, uses_});
    }
  }
  Held held{slot, std::unique_lock<std::mutex>(slot->busy)};
  held.slot->index->Refresh(table);
  return held;
}

std::shared_ptr<IndexSlot> PriorityIndexes::ForDevice(
    uintptr_t place, int64_t rows, float exponent,
    const std::function<std::unique_ptr<IndexMemory>()>& make_memory) {
  std::lock_guard<std::mutex> guard(mutex_);
  int device_entries = 0;
  for (Entry& e : entries_) {
    if (e.place == kCpu) continue;
    ++device_entries;
    if (e.place == place && SameExponent(e.exponent, exponent)) return e.slot;
  }
  if (device_entries >= kMaxDeviceIndexes) return nullptr;
  auto slot = std::make_shared<IndexSlot>();
  slot->index = std::make_unique<PriorityIndex>(rows, exponent, make_memory());
  entries_.push_back(Entry{place, exponent, slot, ++uses_});
  return slot;
}

bool PriorityIndexes::HasDeviceIndexes() {
  std::lock_guard<std::mutex> guard(mutex_);
  for (const Entry& e : entries_) {
    if (e.place != kCpu) return true;
  }
  return false;
}

}  // namespace gear
