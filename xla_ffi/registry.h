// Process-wide registry of open tables, keyed by a stable integer handle.
//
// Compiled programs carry (handle, spec hash), never a pointer. A handler resolves the handle at run
// time and holds a reference for the duration of the call, so closing a table while a program runs
// never unmaps memory under it, and a program that runs after close gets a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "xla_ffi/shared_table.h"

namespace gear {

int64_t RegisterTable(std::shared_ptr<SharedTable> table);
// Registers under a handle an earlier table had (from the pool of closed tables; it must be free).
void RegisterTableAt(int64_t handle, std::shared_ptr<SharedTable> table);
void UnregisterTable(int64_t handle);

// Returns the table, or nullptr with *error set when the handle is closed or the spec differs.
std::shared_ptr<SharedTable> LookupTable(int64_t handle, uint64_t spec_hash, std::string* error);

// Resets *table, a reference to the table registered as `handle`, if the registry still holds that
// table, so that this is never the last reference: for threads that must not run ~SharedTable (a CUDA
// host callback may make no CUDA call). Returns false, leaving *table set, once the handle is closed.
bool ReleaseWhileRegistered(int64_t handle, std::shared_ptr<SharedTable>* table);

}  // namespace gear
