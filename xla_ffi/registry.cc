#include "xla_ffi/registry.h"

#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace gear {
namespace {

struct Registry {
  std::mutex mutex;
  int64_t next_handle = 1;
  std::unordered_map<int64_t, std::shared_ptr<SharedTable>> tables;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: handlers may run during exit
  return *registry;
}

}  // namespace

int64_t RegisterTable(std::shared_ptr<SharedTable> table) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int64_t handle = r.next_handle++;
  r.tables.emplace(handle, std::move(table));
  return handle;
}

void RegisterTableAt(int64_t handle, std::shared_ptr<SharedTable> table) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.tables.emplace(handle, std::move(table)).second) {
    throw std::logic_error("gear_jax table handle " + std::to_string(handle) + " is in use");
  }
}

void UnregisterTable(int64_t handle) {
  std::shared_ptr<SharedTable> released;  // unmapped outside the lock if this was the last reference
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.tables.find(handle);
  if (it == r.tables.end()) return;
  released = std::move(it->second);
  r.tables.erase(it);
}

std::shared_ptr<SharedTable> LookupTable(int64_t handle, uint64_t spec_hash, std::string* error) {
  Registry& r = GetRegistry();
  std::shared_ptr<SharedTable> table;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.tables.find(handle);
    if (it != r.tables.end()) table = it->second;
  }
  if (!table) {
    *error = "gear_jax table handle " + std::to_string(handle) +
             " is closed (or was never opened in this process); a compiled function reads the table "
             "it was traced with: open the table again and re-trace the function";
    return nullptr;
  }
  if (table->header()->spec_hash != spec_hash) {
    *error = "gear_jax table '" + table->name() + "' (handle " + std::to_string(handle) +
             ") has another spec than the function was compiled for; re-trace the function";
    return nullptr;
  }
  return table;
}

bool ReleaseWhileRegistered(int64_t handle, std::shared_ptr<SharedTable>* table) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);  // UnregisterTable cannot drop the registry's reference now
  auto it = r.tables.find(handle);
  if (it == r.tables.end() || it->second != *table) return false;
  table->reset();
  return true;
}

}  // namespace gear
