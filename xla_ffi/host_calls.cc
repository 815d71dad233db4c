#include "xla_ffi/host_calls.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kernels/errors.h"
#include "kernels/gather.h"
#include "kernels/priorities.h"
#include "kernels/sample.h"
#include "xla_ffi/handler_checks.h"
#include "xla_ffi/host_draw.h"
#include "xla_ffi/rate_limiter.h"
#include "xla_ffi/shared_table.h"

namespace py = pybind11;

namespace gear {
namespace {

// Threads that share out large host calls as XLA's intra-op pool shares out the custom calls (the
// kernels' grains decide what is large): one fewer than the CPUs this process may run on, the caller
// being the last. Started at the first call of a process (again in a forked child, whose copy of the
// parent's pool has no threads) and never stopped: idle, they wait on a condition variable.
class HostThreads : public ParallelFor {
 public:
  static const HostThreads& Get() {
    static std::atomic<HostThreads*> current{nullptr};
    HostThreads* pool = current.load(std::memory_order_acquire);
    if (pool != nullptr && pool->pid_ == getpid()) return *pool;
    auto* fresh = new HostThreads();  // leaked on purpose: exit never waits for its threads
    // Two first calls at once: one pool wins, the other's threads stay idle for good.
    return current.compare_exchange_strong(pool, fresh, std::memory_order_acq_rel) ? *fresh : *pool;
  }

  // Unlike XLA's pool, whose idle threads spin a while before they sleep, these sleep at once; calls of
  // fewer than kMinPooledRanges ranges run on the caller (kernels/parallel.h says why).
  void Run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) const override {
    RunOverPool(n, grain, body, helpers_, [this](std::function<void()> task) { Push(std::move(task)); });
  }

 private:
  HostThreads() : pid_(getpid()) {
    cpu_set_t cpus;
    const int available = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    const int wanted = std::clamp(available - 1, 0, 15);
    // Where no more threads can start (a process or memory limit), the calls share out over those
    // that did, or run on the caller alone.
    for (int h = 0; h < wanted; ++h) {
      try {
        std::thread([this] { Work(); }).detach();
      } catch (...) {  // std::system_error, or bad_alloc for the thread's state
        break;
      }
      ++helpers_;
    }
  }

  void Push(std::function<void()> task) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }

  void Work() const {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !tasks_.empty(); });
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  const pid_t pid_;
  int helpers_ = 0;
  mutable std::mutex mutex_;
  mutable std::condition_variable ready_;
  mutable std::deque<std::function<void()>> tasks_;
};

// The scope of a host call's op in error words: "gear_jax.host.<op>: ..." (handler_checks.h).
constexpr const char* kHost = "host.";

std::string HostOp(const char* op) { return std::string(kHost) + op; }

// Raises a refusal (handler_checks.h's words and code) as a gear_jax exception: a kernel that found no
// or too few selectable rows (FAILED_PRECONDITION) as NotEnoughRowsError, the rest as
// InvalidArgumentError.
void ThrowIfError(const ffi::Error& error) {
  if (error.success()) return;
  const bool too_few = error.errc() == ffi::ErrorCode::kFailedPrecondition;
  throw HostCallError(too_few ? "NotEnoughRowsError" : "InvalidArgumentError", error.message());
}

void ThrowIfFailed(const KernelStatus& status) { ThrowIfError(KernelFailure(status, "", kHost)); }

void Refuse(const char* op, const std::string& message) {
  ThrowIfError(OpError(ffi::ErrorCode::kInvalidArgument, HostOp(op).c_str(), message));
}

// The gather of B picks x `steps` into `outputs` (valid first, then one per field of `field_ids`):
// the arrays' own checks here, the fields' as a custom call's (CheckGatherFields), so that no write
// leaves an output.
void PlanGather(const TableView& view, int64_t batch, const std::vector<int64_t>& field_ids, int32_t steps,
                const std::vector<py::array>& outputs, const char* op, GatherRequest* request,
                GatherOutputs* out) {
  if (field_ids.size() > static_cast<size_t>(kMaxFields) || outputs.size() != field_ids.size() + 1) {
    Refuse(op, "expected the valid mask and one output per field (at most " + std::to_string(kMaxFields) +
                   " fields)");
  }
  if (steps < 1 || steps > view.max_steps) {
    Refuse(op, "steps=" + std::to_string(steps) +
                   " is outside [1, max_steps=" + std::to_string(view.max_steps) + "]");
  }
  int64_t output_bytes[kMaxFields];
  for (size_t k = 0; k < outputs.size(); ++k) {
    const py::array& array = outputs[k];
    const std::string what =
        k == 0 ? "the valid mask" : "the output of field " + std::to_string(field_ids[k - 1]);
    if (k == 0 && array.itemsize() != 1) Refuse(op, "the valid mask must be an array of bool");
    if (!(array.flags() & py::array::c_style) || !array.writeable()) {
      Refuse(op, what + " must be a writable C-contiguous array");
    }
    void* data = const_cast<void*>(array.data());
    if (k == 0) {
      if (array.nbytes() != batch * steps) {  // one bool per step
        Refuse(op, what + " holds " + std::to_string(array.nbytes()) + " bytes, expected " +
                       std::to_string(batch * steps));
      }
      out->valid = static_cast<bool*>(data);
    } else {
      output_bytes[k - 1] = static_cast<int64_t>(array.nbytes());
      out->fields[k - 1] = static_cast<uint8_t*>(data);
    }
  }
  ThrowIfError(CheckGatherFields(HostOp(op).c_str(), "output", view, batch, steps, field_ids.data(),
                                 output_bytes, field_ids.size(), request));
}

template <typename T>
void CheckPicks(const py::array_t<T, py::array::c_style>& array, int64_t batch, const char* name,
                const char* op) {
  if (array.ndim() != 1 || array.shape(0) != batch) {
    Refuse(op, std::string(name) + " must have one entry per pick (" + std::to_string(batch) + ")");
  }
}

}  // namespace

namespace {

// The checked selection of a draw (a custom call's checks, CheckSelection, and the batch size and the
// window's bound a custom call has from its shapes and the kernel); each call sets its seed words.
SampleRequest CheckedSelection(const TableView& view, int64_t batch_size, int32_t method,
                               float priority_exponent, int32_t window, const char* op) {
  if (batch_size < 1 || batch_size > 0x7fffffff) Refuse(op, "batch_size must lie in [1, 2**31 - 1]");
  SampleRequest request;
  ThrowIfError(CheckSelection(HostOp(op).c_str(), method, priority_exponent, window, &request));
  if (window > view.max_steps) {
    Refuse(op, "window = " + std::to_string(window) +
                   " is longer than max_steps=" + std::to_string(view.max_steps));
  }
  request.batch_size = batch_size;
  return request;
}

}  // namespace

py::tuple HostSample(OpenTable& self, uint32_t seed0, uint32_t seed1, int64_t batch_size, int32_t method,
                     float priority_exponent, int32_t window, const std::vector<int64_t>& field_ids,
                     int32_t steps, const std::vector<py::array>& outputs) {
  const char* op = outputs.empty() ? "sample" : "sample_gather";
  const std::shared_ptr<SharedTable> held = self.ref();  // kept while the GIL is released
  const TableView& view = held->view();
  SampleRequest request = CheckedSelection(view, batch_size, method, priority_exponent, window, op);
  request.seed0 = seed0;
  request.seed1 = seed1;
  GatherRequest gather;
  GatherOutputs out{};
  if (!outputs.empty()) PlanGather(view, batch_size, field_ids, steps, outputs, op, &gather, &out);

  const auto b = static_cast<py::ssize_t>(batch_size);
  py::array_t<int32_t> indices(b), starts(b), lengths(b);
  py::array_t<uint32_t> generations(b);
  py::array_t<float> probabilities(b);
  int32_t selectable = 0;
  SampleResult picks{indices.mutable_data(),
                     generations.mutable_data(),
                     probabilities.mutable_data(),
                     starts.mutable_data(),
                     nullptr,
                     &selectable,
                     lengths.mutable_data()};
  KernelStatus status;
  {
    py::gil_scoped_release release;
    // As a custom call runs it, over the host threads (DrawOnHost: a first use of the priority index
    // that finds no memory raises MemoryError).
    status = DrawOnHost(*held, request, picks, outputs.empty() ? nullptr : &gather, out, HostThreads::Get());
  }
  ThrowIfFailed(status);
  return py::make_tuple(indices, generations, probabilities, starts, selectable, lengths);
}

HostDraw::HostDraw(py::object table, int64_t batch_size, int32_t method, float priority_exponent,
                   int32_t window, const std::vector<int64_t>& field_ids, int32_t steps,
                   std::vector<py::array> outputs)
    : table_object_(std::move(table)),
      table_(table_object_.cast<OpenTable&>()),
      outputs_(std::move(outputs)),
      indices_(static_cast<py::ssize_t>(std::max<int64_t>(batch_size, 0))),
      starts_(static_cast<py::ssize_t>(std::max<int64_t>(batch_size, 0))),
      generations_(static_cast<py::ssize_t>(std::max<int64_t>(batch_size, 0))),
      probabilities_(static_cast<py::ssize_t>(std::max<int64_t>(batch_size, 0))),
      lengths_(static_cast<py::ssize_t>(std::max<int64_t>(batch_size, 0))) {
  constexpr const char* kOp = "Sampler";
  const std::shared_ptr<SharedTable> held = table_.ref();
  const TableView& view = held->view();
  request_ = CheckedSelection(view, batch_size, method, priority_exponent, window, kOp);
  PlanGather(view, batch_size, field_ids, steps, outputs_, kOp, &gather_, &out_);
  picks_ = SampleResult{indices_.mutable_data(),
                        generations_.mutable_data(),
                        probabilities_.mutable_data(),
                        starts_.mutable_data(),
                        nullptr,
                        nullptr,
                        lengths_.mutable_data()};
}

int32_t HostDraw::Run(uint32_t seed0, uint32_t seed1) {
  if (table_.closed()) throw TableClosedError("gear_jax.host.Sampler: its table is closed; open it again");
  // Two threads drawing into the same arrays at once would interleave their picks and rows. A mark
  // left by another process is a parent's draw copied by a fork, with no thread here to clear it.
  const pid_t me = getpid();
  pid_t holder = 0;
  while (!running_pid_.compare_exchange_strong(holder, me, std::memory_order_acquire)) {
    if (holder == me) {
      Refuse("Sampler",
             "a draw of this sampler is running on another thread; give each thread its own sampler");
    }
  }
  struct Done {
    std::atomic<pid_t>& running_pid;
    ~Done() { running_pid.store(0, std::memory_order_release); }
  } done{running_pid_};
  const std::shared_ptr<SharedTable> held = table_.ref();
  SampleRequest request = request_;
  request.seed0 = seed0;
  request.seed1 = seed1;
  int32_t selectable = 0;
  SampleResult picks = picks_;
  picks.selectable = &selectable;
  KernelStatus status;
  {
    py::gil_scoped_release release;
    status = DrawOnHost(*held, request, picks, &gather_, out_, HostThreads::Get());
  }
  ThrowIfFailed(status);
  return selectable;
}

py::tuple HostDraw::picks() const {
  return py::make_tuple(indices_, generations_, probabilities_, starts_, lengths_);
}

void HostGather(OpenTable& self, const py::array_t<int32_t, py::array::c_style>& indices,
                const py::array_t<uint32_t, py::array::c_style>& generations,
                const py::array_t<int32_t, py::array::c_style>& starts, const std::vector<int64_t>& field_ids,
                int32_t steps, const std::vector<py::array>& outputs) {
  constexpr const char* kOp = "gather";
  const std::shared_ptr<SharedTable> held = self.ref();
  const TableView& view = held->view();
  const int64_t batch = indices.ndim() == 1 ? indices.shape(0) : -1;
  CheckPicks(indices, batch, "indices", kOp);
  CheckPicks(generations, batch, "generations", kOp);
  CheckPicks(starts, batch, "starts", kOp);
  GatherRequest request;
  GatherOutputs out{};
  PlanGather(view, batch, field_ids, steps, outputs, kOp, &request, &out);
  KernelStatus status;
  {
    py::gil_scoped_release release;
    held->CheckCounts(/*force=*/false);
    status = GatherRowsCpu(view, indices.data(), generations.data(), starts.data(), request, out,
                           HostThreads::Get());
  }
  ThrowIfFailed(status);
}

int32_t HostUpdatePriorities(OpenTable& self, const py::array_t<int32_t, py::array::c_style>& indices,
                             const py::array_t<uint32_t, py::array::c_style>& generations,
                             const py::array_t<float, py::array::c_style>& priorities) {
  constexpr const char* kOp = "update_priorities";
  const std::shared_ptr<SharedTable> held = self.ref();
  SharedTable& table = *held;
  const int64_t n = indices.ndim() == 1 ? indices.shape(0) : -1;
  CheckPicks(indices, n, "indices", kOp);
  CheckPicks(generations, n, "generations", kOp);
  CheckPicks(priorities, n, "priorities", kOp);
  int32_t updated = 0;
  KernelStatus status;
  {
    py::gil_scoped_release release;
    table.CheckCounts(/*force=*/false);
    // In a counter window, as the custom call: a priority moved to or from 0 changes `selectable`.
    CounterWindow window(table);
    status = ScatterPrioritiesCpu(table.view(), indices.data(), generations.data(), priorities.data(), n,
                                  &updated);
  }
  ThrowIfFailed(status);
  return updated;
}

py::array_t<bool> HostConsume(OpenTable& self, const py::array_t<int32_t, py::array::c_style>& indices,
                              const py::array_t<uint32_t, py::array::c_style>& generations,
                              const py::array_t<bool, py::array::c_style>& delivered) {
  constexpr const char* kOp = "consume";
  const std::shared_ptr<SharedTable> held = self.ref();
  const int64_t n = indices.ndim() == 1 ? indices.shape(0) : -1;
  CheckPicks(indices, n, "indices", kOp);
  CheckPicks(generations, n, "generations", kOp);
  CheckPicks(delivered, n, "delivered", kOp);
  py::array_t<bool> consumed(n);
  KernelStatus status;
  {
    py::gil_scoped_release release;
    held->CheckCounts(/*force=*/false);
    status = held->Consume(indices.data(), generations.data(), delivered.data(), n, consumed.mutable_data());
  }
  ThrowIfFailed(status);
  return consumed;
}

}  // namespace gear
