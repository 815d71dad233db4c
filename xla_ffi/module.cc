// The pybind11 module gear_jax._native: binds the open tables (open_table.h), the pool of closed tables
// (table_pool.h) and what CUDA devices can do (cuda_runtime.h) for Python, and hands the FFI handlers
// to jax.ffi.register_ffi_target as capsules. Bindings only: the logic lives in the files it includes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/atomics.h"
#include "kernels/sample.h"
#include "xla_ffi/checkpoint_rows.h"
#include "xla_ffi/cpu_handlers.h"
#include "xla_ffi/dead_tables.h"
#include "xla_ffi/host_calls.h"
#include "xla_ffi/native_errors.h"
#include "xla_ffi/open_table.h"
#include "xla_ffi/rate_limiter_admission.h"
#include "xla_ffi/row_writer.h"
#include "xla_ffi/shared_table.h"
#include "xla_ffi/table_pool.h"

#ifndef GEAR_JAX_WITH_CUDA
#define GEAR_JAX_WITH_CUDA 0
#endif
#if GEAR_JAX_WITH_CUDA
#include "xla_ffi/cuda_handlers.h"
#include "xla_ffi/cuda_runtime.h"
#endif

namespace py = pybind11;

namespace gear {
namespace {

py::dict PoolStats() {
  const TablePoolStats s = TablePool::Get().Stats();
  py::dict out;
  out["tables"] = s.tables;
  out["bytes"] = s.bytes;
  out["max_tables"] = s.max_tables;
  out["max_bytes"] = s.max_bytes;
  out["reused"] = s.reused;
  out["reused_handles"] = s.reused_handles;
  out["pooled"] = s.pooled;
  out["refused"] = s.refused;
  return out;
}

// fields: one C-contiguous numpy array per field (any dtype: only its bytes are read). lengths and
// priorities: int32[batch] and float32[batch], or None for `steps` and 1. The rate limiter's admission:
// InsertAdmitted (rate_limiter_admission.h).
py::array_t<int32_t> Insert(OpenTable& self, const std::vector<py::array>& fields, int64_t batch,
                            int32_t steps,
                            const std::optional<py::array_t<int32_t, py::array::c_style>>& lengths,
                            const std::optional<py::array_t<float, py::array::c_style>>& priorities,
                            const std::optional<double>& timeout, bool admit,
                            const std::string& field_types) {
  const TableView& view = self.table().view();
  if (static_cast<int32_t>(fields.size()) != view.num_fields) {
    throw std::invalid_argument("expected one array per field");
  }
  // `field_types`: each field's numpy kind and itemsize as two characters ("f4i4b1"), or empty when
  // every array already has its field's dtype. An array of another dtype is converted here, before
  // anything is claimed (ConvertElements: the casts gear_jax.casting.short_cast lets through).
  if (!field_types.empty() && field_types.size() != 2 * fields.size()) {
    throw std::invalid_argument("field_types needs a kind and an itemsize per field");
  }
  std::vector<std::vector<uint8_t>> converted(field_types.empty() ? 0 : fields.size());
  if (batch < 0) throw std::invalid_argument("batch must be >= 0");
  if (steps < 1 || steps > view.max_steps) throw std::invalid_argument("steps outside [1, max_steps]");
  if ((lengths && lengths->size() != batch) || (priorities && priorities->size() != batch)) {
    throw std::invalid_argument("lengths and priorities need one entry per row");
  }
  std::vector<const uint8_t*> data(static_cast<size_t>(view.num_fields));
  for (int32_t f = 0; f < view.num_fields; ++f) {
    const py::array& array = fields[f];
    if (!(array.flags() & py::array::c_style)) {
      throw std::invalid_argument("field " + std::to_string(f) + " is not a C-contiguous array");
    }
    const int64_t expected = batch * steps * view.fields[f].step_bytes;
    if (!field_types.empty()) {
      const char kind = field_types[2 * f];
      const int32_t itemsize = field_types[2 * f + 1] - '0';
      const char src_kind = array.dtype().kind();
      const auto src_size = static_cast<int32_t>(array.itemsize());
      if ((src_kind != kind || src_size != itemsize) && array.size() * itemsize == expected) {
        std::vector<uint8_t>& out = converted[f];
        out.resize(static_cast<size_t>(expected));
        if (!ConvertElements(static_cast<const uint8_t*>(array.data()), src_kind, src_size, out.data(), kind,
                             itemsize, array.size())) {
          throw std::overflow_error("field " + std::to_string(f) +
                                    ": a value does not fit the field's dtype");
        }
        data[f] = out.data();
        continue;
      }
    }
    if (array.nbytes() != expected) {
      throw std::invalid_argument("field " + std::to_string(f) + " holds " + std::to_string(array.nbytes()) +
                                  " bytes, expected " + std::to_string(expected));
    }
    data[f] = static_cast<const uint8_t*>(array.data());
  }
  py::array_t<int32_t> rows(static_cast<py::ssize_t>(batch));
  InsertAdmitted(self, data, batch, steps, lengths ? lengths->data() : nullptr,
                 priorities ? priorities->data() : nullptr, rows.mutable_data(), timeout, admit);
  return rows;
}

// The table's sampling rules (TableHeader::max_times_sampled, RateLimiterState::queue).
py::dict SamplingRulesOf(OpenTable& self) {
  const TableHeader* h = self.table().header();
  py::dict out;
  out["max_times_sampled"] = h->max_times_sampled;
  out["queue"] = h->rate_limiter.queue != 0;
  return out;
}

// The limiter's settings (None for a table without one).
py::object RateLimiterSettings(OpenTable& self) {
  const RateLimiterState& s = self.table().rate_limiter().settings();
  if (!s.enabled) return py::none();
  py::dict out;
  out["min_size_to_sample"] = s.min_size_to_sample;
  out["samples_per_insert"] = s.samples_per_insert;
  out["error_buffer"] = s.error_buffer;
  out["min_diff"] = s.min_diff;
  out["max_diff"] = s.max_diff;
  return out;
}

py::dict RateLimiterCountsOf(OpenTable& self) {
  SharedTable& table = self.table();
  table.CheckCounts(/*force=*/true);  // `size` exact after a writer's death (as table.size)
  const RateLimiterCounts c = table.rate_limiter().Counts();
  py::dict out;
  out["inserts"] = c.inserts;
  out["samples"] = c.samples;
  out["size"] = c.size;
  out["diff"] = c.diff;
  return out;
}

// Where this process placed the table's columns when it opened it (the header's layout as checked
// then; not read from the shared header again), as byte offsets into the mapping.
py::dict Layout(OpenTable& self) {
  SharedTable& table = self.table();
  const TableView& v = table.view();
  const uint8_t* base = table.base();
  auto offset = [base](const void* p) -> uint64_t {
    return p == nullptr ? 0 : static_cast<uint64_t>(static_cast<const uint8_t*>(p) - base);
  };
  py::dict layout;
  layout["capacity"] = v.capacity;
  layout["max_steps"] = v.max_steps;
  layout["state"] = offset(v.state);
  layout["length"] = offset(v.length);
  layout["insert_seq"] = offset(v.insert_seq);
  layout["times_sampled"] = offset(v.times_sampled);
  layout["writer_pid"] = offset(table.owners());
  layout["change_counts"] = offset(v.change_counts);
  layout["step_capacity"] = v.step_capacity;
  layout["first_step"] = offset(v.first_step);
  py::list fields;
  for (int f = 0; f < v.num_fields; ++f) {
    fields.append(py::make_tuple(offset(v.fields[f].data), v.fields[f].row_stride, v.fields[f].step_bytes));
  }
  layout["fields"] = fields;
  return layout;
}

py::dict Record(const TableRecord& r, bool include_persistent, bool ignore_pid_namespaces) {
  py::dict out;
  out["name"] = r.name;
  out["nbytes"] = r.bytes;
  out["format_version"] = r.format_version;
  out["pool"] = r.pool;
  out["creator_pid"] = r.creator_pid;
  out["creator_pid_namespace"] = r.creator_pid_namespace;
  out["persistent"] = r.persistent;
  out["closed"] = r.closed;
  out["mixed_pid_namespaces"] = r.mixed_pid_namespaces;
  out["same_pid_namespace"] = r.same_pid_namespace;
  out["creator_alive"] = r.creator_alive;
  out["attached_alive"] = r.attached_alive;
  out["writers_alive"] = r.writers_alive;
  out["mapped_elsewhere"] = r.mapped_elsewhere;
  out["truncated"] = r.truncated;
  out["state"] = r.state;
  out["removable"] = Removable(r, include_persistent, ignore_pid_namespaces);
  return out;
}

// Checkpoints (gear_jax/checkpoint.py): checkpoint_rows.h.
py::array_t<uint64_t> ReadStates(OpenTable& self, int64_t start, int64_t count) {
  py::array_t<uint64_t> out(static_cast<py::ssize_t>(std::max<int64_t>(count, 0)));
  ReadRowStates(self.table().view(), start, count, out.mutable_data());
  return out;
}

// The allocation cursor and the last insert_seq handed out, for a checkpoint's manifest.
py::tuple Cursors(OpenTable& self) {
  const TableHeader* h = self.table().header();
  return py::make_tuple(__atomic_load_n(&h->next_seq, __ATOMIC_SEQ_CST),
                        __atomic_load_n(&h->commit_seq, __ATOMIC_SEQ_CST));
}

// ReadStates for the rows `rows` (a save of a step ring checks the episodes it copied, in any rows).
py::array_t<uint64_t> ReadStatesAt(OpenTable& self,
                                   py::array_t<int64_t, py::array::c_style | py::array::forcecast> rows) {
  py::array_t<uint64_t> out(rows.size());
  ReadRowStatesAt(self.table().view(), rows.data(), static_cast<int64_t>(rows.size()), out.mutable_data());
  return out;
}

// The steps [starts[i], starts[i] + counts[i]) of a step ring into out[f] (one C-contiguous array per
// field, each of at least sum(counts) steps), back to back (CopyRingSteps). The GIL is released while
// the steps are copied, so that a save checksums and writes the previous chunk meanwhile.
void CopyRingStepsInto(OpenTable& self,
                       py::array_t<uint64_t, py::array::c_style | py::array::forcecast> starts,
                       py::array_t<int64_t, py::array::c_style | py::array::forcecast> counts,
                       const std::vector<py::array>& out) {
  const std::shared_ptr<SharedTable> held = self.ref();  // kept while the GIL is released (a close meanwhile)
  const TableView& view = held->view();
  if (starts.size() != counts.size())
    throw std::invalid_argument("starts and counts need one entry per piece");
  if (static_cast<int32_t>(out.size()) != view.num_fields)
    throw std::invalid_argument("expected one array per field");
  int64_t total = 0;
  for (py::ssize_t i = 0; i < counts.size(); ++i) total += std::max<int64_t>(counts.data()[i], 0);
  std::vector<uint8_t*> targets(out.size());
  for (size_t f = 0; f < out.size(); ++f) {
    const py::array& array = out[f];
    if (!(array.flags() & py::array::c_style) || !array.writeable()) {
      throw std::invalid_argument("field " + std::to_string(f) + " is not a writable C-contiguous array");
    }
    if (array.nbytes() < static_cast<py::ssize_t>(total * view.fields[f].step_bytes)) {
      throw std::invalid_argument("field " + std::to_string(f) + " holds " + std::to_string(array.nbytes()) +
                                  " bytes, fewer than " + std::to_string(total) + " steps");
    }
    targets[f] = static_cast<uint8_t*>(const_cast<void*>(array.data()));
  }
  py::gil_scoped_release release;
  CopyRingSteps(view, starts.data(), counts.data(), static_cast<int64_t>(counts.size()), targets.data());
}

// A step ring's cursors, for a checkpoint's manifest: next_step, retire_target, retired_below.
py::tuple StepCursors(OpenTable& self) {
  const TableHeader* h = self.table().header();
  return py::make_tuple(__atomic_load_n(&h->next_step, __ATOMIC_SEQ_CST),
                        __atomic_load_n(&h->retire_target, __ATOMIC_SEQ_CST),
                        __atomic_load_n(&h->retired_below, __ATOMIC_SEQ_CST));
}

// The largest priority a row of the table was given so far (0 before any row had one above 0).
float MaxPriority(OpenTable& self) {
  const uint32_t bits = __atomic_load_n(self.table().view().max_priority_bits, __ATOMIC_RELAXED);
  float priority;
  std::memcpy(&priority, &bits, sizeof(priority));
  return priority;
}

// Raises the gear_jax exception `type` (gear_jax/errors.py).
void RaiseAs(const char* type, const char* message) {
  py::set_error(py::module_::import("gear_jax.errors").attr(type), message);
}

// The one place native exceptions (native_errors.h) become Python's: each is raised as its gear_jax.errors
// class, so that no Python module maps them again. Anything else keeps pybind11's own translation.
void RegisterNativeErrors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NotFoundError& e) {
      RaiseAs("TableNotFoundError", e.what());
    } catch (const FormatError& e) {
      RaiseAs("TableMismatchError", e.what());
    } catch (const OutOfSpaceError& e) {
      RaiseAs("OutOfSpaceError", e.what());
    } catch (const RateLimiterTimeoutError& e) {
      RaiseAs("RateLimiterTimeout", e.what());
    } catch (const InvalidArgument& e) {  // RateLimiterRefusal among them
      RaiseAs("InvalidArgumentError", e.what());
    } catch (const TableClosedError& e) {
      RaiseAs("TableClosedError", e.what());
    } catch (const AllRowsHeldError& e) {
      RaiseAs("AllRowsHeldError", e.what());
    } catch (const HostCallError& e) {
      RaiseAs(e.python_type(), e.what());
    }
  });
}

template <typename T>
py::capsule Capsule(T* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace
}  // namespace gear

PYBIND11_MODULE(_native, m) {
  using gear::OpenTable;
  using gear::SharedTable;
  m.doc() = "gear_jax native runtime: shared-memory tables and XLA FFI handlers";

  gear::RegisterNativeErrors();

  m.def("registrations", [] {
    py::dict cpu;
    cpu["gear_jax_sample"] = gear::Capsule(GearJaxSampleCpu);
    cpu["gear_jax_gather"] = gear::Capsule(GearJaxGatherCpu);
    cpu["gear_jax_update_priorities"] = gear::Capsule(GearJaxUpdatePrioritiesCpu);
    cpu["gear_jax_total_weight"] = gear::Capsule(GearJaxTotalWeightCpu);
    cpu["gear_jax_sample_at"] = gear::Capsule(GearJaxSampleAtCpu);
    cpu["gear_jax_ordered_candidates"] = gear::Capsule(GearJaxOrderedCandidatesCpu);
    cpu["gear_jax_sample_gather"] = gear::Capsule(GearJaxSampleGatherCpu);
    cpu["gear_jax_insert"] = gear::Capsule(GearJaxInsertCpu);
    cpu["gear_jax_shuffle"] = gear::Capsule(GearJaxShuffleCpu);  // CPU only: GPUs sort fast (epochs.py)
    cpu["gear_jax_consume"] = gear::Capsule(GearJaxConsumeCpu);
    py::dict out;
    out["cpu"] = cpu;
#if GEAR_JAX_WITH_CUDA
    py::dict cuda;
    cuda["gear_jax_sample"] = gear::Capsule(GearJaxSampleCuda);
    cuda["gear_jax_gather"] = gear::Capsule(GearJaxGatherCuda);
    cuda["gear_jax_sample_gather"] = gear::Capsule(GearJaxSampleGatherCuda);
    cuda["gear_jax_update_priorities"] = gear::Capsule(GearJaxUpdatePrioritiesCuda);
    cuda["gear_jax_consume"] = gear::Capsule(GearJaxConsumeCuda);
    cuda["gear_jax_total_weight"] = gear::Capsule(GearJaxTotalWeightCuda);
    cuda["gear_jax_sample_at"] = gear::Capsule(GearJaxSampleAtCuda);
    cuda["gear_jax_ordered_candidates"] = gear::Capsule(GearJaxOrderedCandidatesCuda);
    cuda["gear_jax_insert"] = gear::Capsule(GearJaxInsertCuda);
    out["CUDA"] = cuda;
#endif
    return out;
  });
  m.attr("with_cuda") = py::bool_(GEAR_JAX_WITH_CUDA);
  // The window law's flags in the selection calls' method word (kernels/sample.h).
  m.attr("SKIP_SHORT_FLAG") = gear::kSkipShortFlag;
  m.attr("UNIFORM_STARTS_FLAG") = gear::kUniformStartsFlag;
  m.def(
      "sample_methods",
      [] {
        py::dict out;
        for (const gear::SampleMethodName& m : gear::kSampleMethods)
          out[m.name] = static_cast<int32_t>(m.method);
        return out;
      },
      "The selection methods of gear_jax.sample: name -> the number the custom call carries");
  m.def(
      "cuda_device_count",
      [] {
#if GEAR_JAX_WITH_CUDA
        return gear::CudaDeviceCount();
#else
        return 0;
#endif
      },
      "CUDA devices this process can use (0 in a CPU-only build, or without a GPU)");
  m.def(
      "cuda_device_info",
      [](int device) {
#if GEAR_JAX_WITH_CUDA
        gear::CudaDeviceInfo info;
        std::string error;
        if (!gear::DescribeCudaDevice(device, &info, &error)) throw std::runtime_error(error);
        py::dict out;
        out["name"] = info.name;
        out["compute_capability"] = info.compute_capability;
        out["host_native_atomics"] = info.host_native_atomics;
        out["pageable_memory_access"] = info.pageable_memory_access;
        out["host_register_supported"] = info.host_register_supported;
        return out;
#else
        (void)device;
        throw std::runtime_error("this gear_jax build has no CUDA support");
        return py::dict();
#endif
      },
      py::arg("device"), "What CUDA device `device` can do with host memory");
  m.attr("format_version") = gear::kFormatVersion;
  m.def("pool_stats", &gear::PoolStats, "The pool of closed tables: what it holds, its limits, its counts");
  m.def("pool_clear", [] { gear::TablePool::Get().Clear(); }, "Drops every closed table the pool holds");
  m.def(
      "pool_configure",
      [](int64_t max_tables, uint64_t max_bytes) {
        if (max_tables < 0) throw std::invalid_argument("max_tables must be >= 0");
        gear::TablePool::Get().Configure(max_tables, max_bytes);
      },
      py::arg("max_tables"), py::arg("max_bytes"));
  m.def("row_stride", &gear::RowStride, py::arg("row_bytes"));

  // Tables whose processes are all gone (dead_tables.h), for gear_jax.cleanup.
  m.def(
      "find_tables",
      [](bool include_persistent, bool ignore_pid_namespaces) {
        py::list out;
        for (const gear::TableRecord& r : gear::FindTables()) {
          out.append(gear::Record(r, include_persistent, ignore_pid_namespaces));
        }
        return out;
      },
      py::arg("include_persistent") = false, py::arg("ignore_pid_namespaces") = false,
      "Every gear_jax table in /dev/shm: its header, its processes alive, its state, whether removable");
  m.def("remove_dead_table", &gear::RemoveIfDead, py::arg("name"), py::arg("include_persistent") = false,
        py::arg("ignore_pid_namespaces") = false, "Removes the table `name` if it is dead; whether it did");
  m.def(
      "sweep_dead_tables", [] { return gear::SweepDeadTables(/*force=*/true); },
      "Removes every dead table that is not persistent (as a create does); returns their names");
  m.def("pid_namespace", &gear::PidNamespace, "This process's PID namespace (0: unknown)");
  m.def(
      "set_malloc_thresholds",
      [](int64_t mmap_threshold, int64_t trim_threshold) {
#if defined(__GLIBC__)
        if (mmap_threshold <= 0 || trim_threshold <= 0 || mmap_threshold > INT32_MAX ||
            trim_threshold > INT32_MAX)
          throw std::invalid_argument("malloc thresholds must lie in [1, 2^31)");
        return mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1 &&
               mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) == 1;
#else
        (void)mmap_threshold;
        (void)trim_threshold;
        return false;
#endif
      },
      py::arg("mmap_threshold"), py::arg("trim_threshold"),
      "glibc's mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD) for this process "
      "(gear_jax/malloc.py); "
      "false where either is refused or the C library is not glibc");
  m.def(
      "header_offsets",
      [] {
        py::dict out;
        out["format_version"] = offsetof(gear::TableHeader, format_version);
        out["spec_json_bytes"] = offsetof(gear::TableHeader, spec_json_bytes);
        out["spec_hash"] = offsetof(gear::TableHeader, spec_hash);
        out["capacity"] = offsetof(gear::TableHeader, capacity);
        out["max_steps"] = offsetof(gear::TableHeader, max_steps);
        out["num_fields"] = offsetof(gear::TableHeader, num_fields);
        out["writer_pid_offset"] = offsetof(gear::TableHeader, writer_pid_offset);
        out["fields"] = offsetof(gear::TableHeader, fields);
        out["field_bytes"] = sizeof(gear::FieldLayout);
        out["creator_pid"] = offsetof(gear::TableHeader, creator_pid);
        out["persistent"] = offsetof(gear::TableHeader, persistent);
        out["creator_pid_namespace"] = offsetof(gear::TableHeader, creator_pid_namespace);
        out["mixed_pid_namespaces"] = offsetof(gear::TableHeader, mixed_pid_namespaces);
        out["liveness_unproven"] = offsetof(gear::TableHeader, liveness_unproven);
        out["liveness_inode"] = offsetof(gear::TableHeader, liveness_inode);
        out["first_step_offset"] = offsetof(gear::TableHeader, first_step_offset);
        out["state_offset"] = offsetof(gear::TableHeader, state_offset);
        out["writer_pid_offset"] = offsetof(gear::TableHeader, writer_pid_offset);
        return out;
      },
      "Byte offsets of some header fields (for tests)");

  // The bytes of an open table, for numpy views: each view keeps the mapping (not the open) alive, so
  // a view that outlives close() still points at mapped memory (which the pool will not reuse).
  struct TableMapping {
    std::shared_ptr<SharedTable> table;
  };
  py::class_<TableMapping>(m, "TableMapping", py::buffer_protocol()).def_buffer([](TableMapping& self) {
    return py::buffer_info(self.table->base(), 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(self.table->total_bytes())}, {1});
  });

  py::class_<OpenTable>(m, "NativeTable")
      .def_static(
          "create",
          [](const std::string& name, int64_t capacity, int32_t max_steps,
             const std::vector<int64_t>& step_bytes, const std::string& spec_json, uint64_t spec_hash,
             bool pin, bool reuse, bool outlive_creator,
             const std::optional<std::tuple<int64_t, double, double>>& rate_limiter, int64_t step_capacity,
             uint32_t max_times_sampled, bool queue) {
            gear::RateLimiterState limiter{};  // disabled
            if (rate_limiter) {
              const auto& [min_size_to_sample, samples_per_insert, error_buffer] = *rate_limiter;
              limiter = gear::MakeRateLimiter(min_size_to_sample, samples_per_insert, error_buffer, capacity);
            }
            return gear::CreateTable(name, capacity, max_steps, step_bytes, spec_json, spec_hash, pin, reuse,
                                     outlive_creator, limiter, step_capacity,
                                     gear::SamplingRules{max_times_sampled, queue});
          },
          py::arg("name"), py::arg("capacity"), py::arg("max_steps"), py::arg("step_bytes"),
          py::arg("spec_json"), py::arg("spec_hash"), py::arg("pin"), py::arg("reuse"),
          py::arg("outlive_creator") = false, py::arg("rate_limiter") = py::none(),
          py::arg("step_capacity") = 0, py::arg("max_times_sampled") = 0, py::arg("queue") = false,
          "rate_limiter: (min_size_to_sample, samples_per_insert or 0, error_buffer), or None for none; "
          "step_capacity > 0: a step ring of that many steps (max_steps: the longest episode); "
          "max_times_sampled: 0 or the samples after which a row is retired; queue: a consuming queue")
      .def_static("attach", &gear::AttachTable, py::arg("name"), py::arg("pin"))
      .def(
          "mapping", [](OpenTable& self) { return TableMapping{self.ref()}; },
          "The table's bytes (buffer protocol); views of it keep the memory mapped")
      .def("close", &OpenTable::Close)
      .def_property_readonly("closed", &OpenTable::closed)
      .def_property_readonly("handle", &OpenTable::handle)
      .def_property_readonly("name", &OpenTable::name)
      .def_property_readonly("creator", &OpenTable::creator)
      .def_property_readonly("spec_json", [](OpenTable& s) { return s.table().spec_json(); })
      // The same bytes, undecoded: a damaged header's need not be UTF-8 (Table.attach decodes them).
      .def_property_readonly("spec_json_bytes", [](OpenTable& s) { return py::bytes(s.table().spec_json()); })
      .def_property_readonly("spec_hash", [](OpenTable& s) { return s.table().header()->spec_hash; })
      .def_property_readonly("total_bytes", [](OpenTable& s) { return s.table().total_bytes(); })
      .def_property_readonly("pinned", [](OpenTable& s) { return s.table().pinned(); })
      .def_property_readonly("creator_pid", [](OpenTable& s) { return s.table().header()->creator_pid; })
      .def_property_readonly("persistent", [](OpenTable& s) { return s.table().header()->persistent != 0; })
      .def_property_readonly("mixed_pid_namespaces",
                             [](OpenTable& s) {
                               return __atomic_load_n(&s.table().header()->mixed_pid_namespaces,
                                                      __ATOMIC_SEQ_CST) != 0;
                             })
      .def_property_readonly("liveness_unproven",
                             [](OpenTable& s) {
                               return __atomic_load_n(&s.table().header()->liveness_unproven,
                                                      __ATOMIC_SEQ_CST) != 0;
                             })
      // Both repair the counters first if a writer died while changing them (SharedTable::CheckCounts).
      .def_property_readonly("size",
                             [](OpenTable& s) {
                               s.table().CheckCounts(/*force=*/true);
                               return gear::LoadRelaxed(&s.table().header()->size);
                             })
      .def_property_readonly("selectable",
                             [](OpenTable& s) {
                               s.table().CheckCounts(/*force=*/true);
                               return gear::LoadRelaxed(&s.table().header()->selectable);
                             })
      .def_property_readonly(
          "next_seq",
          [](OpenTable& s) { return __atomic_load_n(&s.table().header()->next_seq, __ATOMIC_RELAXED); })
      .def("layout", &gear::Layout)
      .def("read_states", &gear::ReadStates, py::arg("start"), py::arg("count"))
      .def("cursors", &gear::Cursors)
      .def("max_priority", &gear::MaxPriority)
      .def(
          "check_priorities",
          [](OpenTable& self, py::array_t<float, py::array::c_style | py::array::forcecast> priorities) {
            // SharedTable::CheckPriority over an array (InvalidArgumentError), for a caller that claims
            // rows itself and must refuse a priority before it claims any (gear_jax.torch.insert_tensors).
            const SharedTable& table = self.table();
            for (py::ssize_t i = 0; i < priorities.size(); ++i)
              table.CheckPriority(priorities.data()[i], "priorities[" + std::to_string(i) + "]");
          },
          py::arg("priorities"))
      .def(
          "publish_restored_rows",
          [](OpenTable& self, int64_t start,
             py::array_t<uint64_t, py::array::c_style | py::array::forcecast> states) {
            return gear::PublishRestoredRows(self.table().view(), start, states.data(),
                                             static_cast<int64_t>(states.size()));
          },
          py::arg("start"), py::arg("states"))
      .def(
          "restore_cursors",
          [](OpenTable& self, uint64_t next_seq, uint64_t commit_seq) {
            gear::RestoreCursors(self.table(), next_seq, commit_seq);
          },
          py::arg("next_seq"), py::arg("commit_seq"))
      .def("read_states_at", &gear::ReadStatesAt, py::arg("rows"))
      .def("copy_ring_steps", &gear::CopyRingStepsInto, py::arg("starts"), py::arg("counts"), py::arg("out"))
      .def("step_cursors", &gear::StepCursors)
      .def(
          "publish_restored_rows_at",
          [](OpenTable& self, py::array_t<int64_t, py::array::c_style | py::array::forcecast> rows,
             py::array_t<uint64_t, py::array::c_style | py::array::forcecast> states) {
            if (rows.size() != states.size())
              throw std::invalid_argument("rows and states need one entry per row");
            return gear::PublishRestoredRowsAt(self.table().view(), rows.data(), states.data(),
                                               static_cast<int64_t>(states.size()));
          },
          py::arg("rows"), py::arg("states"))
      .def(
          "restore_step_cursor",
          [](OpenTable& self, uint64_t next_step) { gear::RestoreStepCursor(self.table(), next_step); },
          py::arg("next_step"))
      .def("insert", &gear::Insert, py::arg("fields"), py::arg("batch"), py::arg("steps"), py::arg("lengths"),
           py::arg("priorities"), py::arg("timeout") = py::none(), py::arg("admit") = true,
           py::arg("field_types") = std::string())
      .def("claim", &OpenTable::Claim)
      .def("commit", &gear::CommitAdmitted, py::arg("row"), py::arg("length"), py::arg("priority"),
           py::arg("timeout") = py::none(), py::arg("reserved") = false)
      .def("reserve_inserts", &gear::ReserveInserts, py::arg("n"), py::arg("timeout") = py::none())
      .def(
          "return_inserts", [](OpenTable& self, int64_t n) { self.table().rate_limiter().ReturnInserts(n); },
          py::arg("n"))
      .def("await_samples", &gear::AwaitSamples, py::arg("n"), py::arg("timeout") = py::none())
      .def(
          "can_sample",
          [](OpenTable& self, int64_t n) {
            return self.table().rate_limiter().Allows(gear::RateOp::kSample, n);
          },
          py::arg("n"))
      .def(
          "count_published_inserts",
          [](OpenTable& self, int64_t n) { self.table().rate_limiter().CountInserts(n); }, py::arg("n"),
          "Counts n rows already published as inserts (a loaded queue's unconsumed rows)")
      .def("rate_limiter", &gear::RateLimiterSettings)
      .def("sampling_rules", &gear::SamplingRulesOf)
      .def("rate_limiter_counts", &gear::RateLimiterCountsOf)
      .def("abandon", &OpenTable::Abandon, py::arg("row"))
      // gear_jax.host: the CPU kernels on numpy arrays, outside XLA (host_calls.h).
      .def("host_sample", &gear::HostSample, py::arg("seed0"), py::arg("seed1"), py::arg("batch_size"),
           py::arg("method"), py::arg("priority_exponent"), py::arg("window"), py::arg("field_ids"),
           py::arg("steps"), py::arg("outputs"))
      .def("host_gather", &gear::HostGather, py::arg("indices"), py::arg("generations"), py::arg("starts"),
           py::arg("field_ids"), py::arg("steps"), py::arg("outputs"))
      .def("host_update_priorities", &gear::HostUpdatePriorities, py::arg("indices"), py::arg("generations"),
           py::arg("priorities"))
      .def("host_consume", &gear::HostConsume, py::arg("indices"), py::arg("generations"),
           py::arg("delivered"));

  py::class_<gear::HostDraw>(m, "HostDraw", "One draw repeated into the same arrays (host_calls.h)")
      .def(py::init<py::object, int64_t, int32_t, float, int32_t, const std::vector<int64_t>&, int32_t,
                    std::vector<py::array>>(),
           py::arg("table"), py::arg("batch_size"), py::arg("method"), py::arg("priority_exponent"),
           py::arg("window"), py::arg("field_ids"), py::arg("steps"), py::arg("outputs"))
      .def("run", &gear::HostDraw::Run, py::arg("seed0"), py::arg("seed1"))
      .def("picks", &gear::HostDraw::picks);

  py::class_<gear::RowWriter>(m, "RowWriter", "The short path of one-row writes (row_writer.h)")
      .def(py::init([](py::object table,
                       const std::vector<std::tuple<std::string, std::string, int32_t, std::vector<int64_t>>>&
                           fields) {
             std::vector<std::string> names;
             std::vector<gear::StepFieldType> types;
             for (const auto& [name, kind, itemsize, shape] : fields) {
               names.push_back(name);
               types.push_back({kind.size() == 1 ? kind[0] : '\0', itemsize, shape});
             }
             return std::make_unique<gear::RowWriter>(std::move(table), std::move(names), std::move(types));
           }),
           py::arg("table"), py::arg("fields"))
      .def("pack", &gear::RowWriter::Pack, py::arg("step"), py::arg("strict"),
           py::arg("batch_axis") = int32_t{gear::RowWriter::kNone})
      .def("write_packed", &gear::RowWriter::WritePacked, py::arg("row"), py::arg("step"))
      .def("add", &gear::RowWriter::Add, py::arg("row"), py::arg("strict"), py::arg("priority"),
           py::arg("timeout") = py::none(), py::arg("batch_axis") = int32_t{gear::RowWriter::kNone})
      .def("stage_packed", &gear::RowWriter::StagePacked)
      .def("stage_step", &gear::RowWriter::StageStep, py::arg("values"))
      .def_property_readonly("staged_steps", &gear::RowWriter::staged_steps)
      .def("replace_staged", &gear::RowWriter::ReplaceStaged, py::arg("field"), py::arg("values"))
      .def("commit_staged", &gear::RowWriter::CommitStaged, py::arg("priority"),
           py::arg("timeout") = py::none())
      .def("drop_staged", &gear::RowWriter::DropStaged);
}
