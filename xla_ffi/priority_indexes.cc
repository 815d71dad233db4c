#include "xla_ffi/priority_indexes.h"

#include <cstring>

namespace gear {
namespace {

bool SameExponent(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

}  // namespace

PriorityIndexes::State& PriorityIndexes::Current() {
  State* state = state_.load(std::memory_order_acquire);
  if (state != nullptr && state->pid == getpid()) return *state;
  auto* fresh = new State();
  // Two first uses at once: one state wins, the other is deleted unused. The state a forked child
  // replaces is leaked (see State).
  if (state_.compare_exchange_strong(state, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *state;
}

PriorityIndexes::Held PriorityIndexes::ForCpu(const TableView& table, float exponent) {
  State& state = Current();
  std::shared_ptr<IndexSlot> slot;
  {
    std::lock_guard<std::mutex> guard(state.mutex);
    const uint64_t use = ++state.uses;
    std::vector<Entry>& entries = state.entries;
    int cpu_entries = 0;
    for (Entry& e : entries) {
      if (e.place != kCpu) continue;
      ++cpu_entries;
      if (SameExponent(e.exponent, exponent)) {
        e.last_use = use;
        slot = e.slot;
      }
    }
    if (slot == nullptr) {
      if (cpu_entries >= kMaxCpuIndexes) {  // the least recently used CPU index gives way
        auto oldest = entries.end();
        for (auto it = entries.begin(); it != entries.end(); ++it) {
          if (it->place == kCpu && (oldest == entries.end() || it->last_use < oldest->last_use)) oldest = it;
        }
        entries.erase(oldest);  // a call still using it keeps it alive until it is done
      }
      slot = std::make_shared<IndexSlot>();
      slot->index = std::make_unique<PriorityIndex>(table.capacity, exponent, PlainIndexMemory());
      entries.push_back(Entry{kCpu, exponent, slot, use});
    }
  }
  Held held{slot, std::unique_lock<std::mutex>(slot->busy)};
  held.slot->index->Refresh(table);
  return held;
}

std::shared_ptr<IndexSlot> PriorityIndexes::ForDevice(
    uintptr_t place, int64_t rows, float exponent,
    const std::function<std::unique_ptr<IndexMemory>()>& make_memory) {
  State& state = Current();
  // The entry of (place, exponent), or null with *room set to whether another device entry fits.
  auto find = [&](bool* room) -> std::shared_ptr<IndexSlot> {
    int device_entries = 0;
    for (Entry& e : state.entries) {
      if (e.place == kCpu) continue;
      ++device_entries;
      if (e.place == place && SameExponent(e.exponent, exponent)) return e.slot;
    }
    *room = device_entries < kMaxDeviceIndexes;
    return nullptr;
  };
  bool room = false;
  {
    std::lock_guard<std::mutex> guard(state.mutex);
    if (std::shared_ptr<IndexSlot> slot = find(&room); slot != nullptr || !room) return slot;
  }
  // A new index's pinned memory is allocated (and freed, when its construction fails or another thread
  // made the same index meanwhile) outside the lock: those CUDA calls may wait for the device, whose
  // host callbacks take the lock (a GPU's samples made on the host use the CPU's indexes).
  auto made = std::make_shared<IndexSlot>();
  made->index = std::make_unique<PriorityIndex>(rows, exponent, make_memory());
  std::lock_guard<std::mutex> guard(state.mutex);
  if (std::shared_ptr<IndexSlot> slot = find(&room); slot != nullptr || !room) {
    return slot;  // `made` is freed after the lock is released (declared before the guard)
  }
  state.entries.push_back(Entry{place, exponent, made, ++state.uses});
  return made;
}

bool PriorityIndexes::HasDeviceIndexes() {
  State& state = Current();
  std::lock_guard<std::mutex> guard(state.mutex);
  for (const Entry& e : state.entries) {
    if (e.place != kCpu) return true;
  }
  return false;
}

}  // namespace gear
