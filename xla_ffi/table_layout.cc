#include "xla_ffi/table_layout.h"

#include <cstring>
#include <stdexcept>

namespace gear {
namespace {

uint64_t RoundUp(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Whether every column the header describes lies inside a mapping of `size` bytes.
bool LayoutFits(const TableHeader& h, uint64_t size) {
  if (h.capacity < 1 || h.capacity > INT32_MAX || h.max_steps < 1 || h.num_fields < 1 ||
      h.num_fields > kMaxFields) {
    return false;
  }
  const uint64_t rows = static_cast<uint64_t>(h.capacity);
  auto inside = [&](uint64_t offset, uint64_t stride) {
    uint64_t bytes = 0, end = 0;
    return !__builtin_mul_overflow(rows, stride, &bytes) && !__builtin_add_overflow(offset, bytes, &end) &&
           offset >= sizeof(TableHeader) && end <= size;
  };
  if (!inside(h.state_offset, 8) || !inside(h.length_offset, 4) || !inside(h.insert_seq_offset, 8) ||
      !inside(h.times_sampled_offset, 4) || !inside(h.writer_pid_offset, 4) ||
      !inside(h.change_counts_offset, 4)) {
    return false;
  }
  if (h.step_capacity < 0 ||
      (h.step_capacity > 0 && (h.max_steps > h.step_capacity || !inside(h.first_step_offset, 8)))) {
    return false;
  }
  for (int f = 0; f < h.num_fields; ++f) {
    const FieldLayout& field = h.fields[f];
    int64_t row_bytes = 0;
    if (h.step_capacity > 0) {  // a ring: step_capacity steps, inside the file
      uint64_t ring_bytes = 0, end = 0;
      if (field.step_bytes < 1 || field.row_stride != 0 ||
          __builtin_mul_overflow(static_cast<uint64_t>(field.step_bytes),
                                 static_cast<uint64_t>(h.step_capacity), &ring_bytes) ||
          __builtin_add_overflow(field.offset, ring_bytes, &end) || field.offset < sizeof(TableHeader) ||
          end > size) {
        return false;
      }
      continue;
    }
    if (field.step_bytes < 1 ||
        __builtin_mul_overflow(field.step_bytes, static_cast<int64_t>(h.max_steps), &row_bytes) ||
        field.row_stride < row_bytes || !inside(field.offset, static_cast<uint64_t>(field.row_stride))) {
      return false;
    }
  }
  return true;
}

// What is wrong with the columns of a header that LayoutFits a mapping (empty: nothing). They must be
// exactly where PlanTable puts them for the header's capacity, max_steps and step sizes: then no two
// columns overlap, each is aligned as the kernels assume, and every row of a field holds max_steps
// steps within its own stride. The spec JSON is checked against this layout by gear_jax.Table.attach.
std::string LayoutProblem(const TableHeader& h, uint64_t size) {
  std::vector<int64_t> step_bytes;
  for (int f = 0; f < h.num_fields; ++f) step_bytes.push_back(h.fields[f].step_bytes);
  TablePlan plan{};
  try {
    plan = PlanTable(h.capacity, h.max_steps, step_bytes, std::string(), h.step_capacity);
  } catch (const std::exception& e) {
    return std::string("its layout can not be planned (") + e.what() + ")";
  }
  if (plan.total_bytes > size) {
    return "its layout needs " + std::to_string(plan.total_bytes) + " bytes, the file holds " +
           std::to_string(size);
  }
  const TableHeader& want = plan.layout;
  if (h.state_offset != want.state_offset || h.length_offset != want.length_offset ||
      h.insert_seq_offset != want.insert_seq_offset || h.times_sampled_offset != want.times_sampled_offset ||
      h.writer_pid_offset != want.writer_pid_offset || h.change_counts_offset != want.change_counts_offset ||
      h.first_step_offset != want.first_step_offset) {
    return "its row status columns are not where its layout puts them";
  }
  for (int f = 0; f < h.num_fields; ++f) {
    const FieldLayout &have = h.fields[f], &planned = want.fields[f];
    if (have.offset != planned.offset || have.row_stride != planned.row_stride) {
      return "the column of field " + std::to_string(f) + " (offset " + std::to_string(have.offset) +
             ", row stride " + std::to_string(have.row_stride) +
             ") is not where its layout puts it (offset " + std::to_string(planned.offset) + ", row stride " +
             std::to_string(planned.row_stride) + ")";
    }
  }
  return {};
}

}  // namespace

int64_t RowStride(int64_t row_bytes) {
  return static_cast<int64_t>(RoundUp(row_bytes, row_bytes >= 1024 ? 128 : 16));
}

TablePlan PlanTable(int64_t capacity, int32_t max_steps, const std::vector<int64_t>& step_bytes,
                    const std::string& spec_json, int64_t step_capacity) {
  if (capacity < 1 || capacity > INT32_MAX) throw std::invalid_argument("capacity must be in [1, 2**31 - 1]");
  if (max_steps < 1) throw std::invalid_argument("max_steps must be >= 1");
  if (step_capacity < 0 || step_capacity > (int64_t{1} << 48))
    throw std::invalid_argument("step_capacity must be in [0, 2**48]");
  if (step_capacity > 0 && max_steps > step_capacity)
    throw std::invalid_argument("max_steps (the longest episode) must be at most step_capacity");
  if (step_bytes.empty() || step_bytes.size() > static_cast<size_t>(kMaxFields)) {
    throw std::invalid_argument("a table needs 1 to 64 fields");
  }
  if (spec_json.size() >= kSpecJsonCapacity) throw std::invalid_argument("the spec is too large to store");

  TablePlan plan{};
  TableHeader& layout = plan.layout;
  uint64_t offset = RoundUp(sizeof(TableHeader), kColumnAlign);
  auto too_large = [] {
    return std::invalid_argument("the table is too large to address (capacity x max_steps x field bytes)");
  };
  auto column = [&](uint64_t bytes) {
    uint64_t at = offset, end = 0;
    if (bytes > (uint64_t{1} << 60) || __builtin_add_overflow(offset, bytes + kColumnAlign, &end) ||
        end > (uint64_t{1} << 60)) {
      throw too_large();
    }
    offset = RoundUp(offset + bytes, kColumnAlign);
    return at;
  };
  const uint64_t rows = static_cast<uint64_t>(capacity);
  // The status columns first and together: reusing memory clears them in one stretch.
  layout.state_offset = column(rows * sizeof(uint64_t));
  layout.length_offset = column(rows * sizeof(int32_t));
  layout.insert_seq_offset = column(rows * sizeof(uint64_t));
  layout.times_sampled_offset = column(rows * sizeof(uint32_t));
  layout.writer_pid_offset = column(rows * sizeof(int32_t));
  layout.change_counts_offset =
      column(static_cast<uint64_t>(ChangeCounterCount(capacity)) * sizeof(uint32_t));
  if (step_capacity > 0) layout.first_step_offset = column(rows * sizeof(uint64_t));
  layout.step_capacity = step_capacity;
  for (size_t f = 0; f < step_bytes.size(); ++f) {
    if (step_bytes[f] < 1) throw std::invalid_argument("every field needs at least one byte per step");
    if (step_capacity > 0) {  // a ring of step_capacity steps, back to back
      uint64_t ring_bytes = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(step_bytes[f]), static_cast<uint64_t>(step_capacity),
                                 &ring_bytes)) {
        throw too_large();
      }
      layout.fields[f] = FieldLayout{column(ring_bytes), 0, step_bytes[f]};
      continue;
    }
    int64_t row_bytes = 0;
    uint64_t column_bytes = 0;
    if (__builtin_mul_overflow(step_bytes[f], static_cast<int64_t>(max_steps), &row_bytes) ||
        row_bytes > (int64_t{1} << 48)) {
      throw too_large();
    }
    const int64_t stride = RowStride(row_bytes);
    if (__builtin_mul_overflow(rows, static_cast<uint64_t>(stride), &column_bytes)) throw too_large();
    layout.fields[f] = FieldLayout{column(column_bytes), stride, step_bytes[f]};
  }
  layout.capacity = capacity;
  layout.max_steps = max_steps;
  layout.num_fields = static_cast<int32_t>(step_bytes.size());
  plan.total_bytes = offset;
  return plan;
}

std::string HeaderProblem(const TableHeader& h, uint64_t size) {
  // The magic first, with acquire: a header with magic is complete (the creator writes it last).
  char magic[sizeof(kTableMagic)];
  for (size_t i = 0; i < sizeof(magic); ++i) magic[i] = __atomic_load_n(&h.magic[i], __ATOMIC_ACQUIRE);
  if (std::memcmp(magic, kTableMagic, sizeof(kTableMagic)) != 0) {
    return "is not a gear_jax table (no gear_jax header)";
  }
  if (h.format_version != kFormatVersion) {
    return "has table format " + std::to_string(h.format_version) + ", this gear_jax reads format " +
           std::to_string(kFormatVersion);
  }
  if (h.total_bytes != size) {
    return "has a damaged header: it gives the table " + std::to_string(h.total_bytes) +
           " bytes, the file holds " + std::to_string(size);
  }
  if (h.spec_json_bytes >= kSpecJsonCapacity) {
    return "has a damaged header: its spec JSON length " + std::to_string(h.spec_json_bytes) +
           " is past the " + std::to_string(kSpecJsonCapacity) + " bytes it has room for";
  }
  if (!LayoutFits(h, size)) {
    return "has a damaged header: its layout (capacity " + std::to_string(h.capacity) + ", max_steps " +
           std::to_string(h.max_steps) + ", " + std::to_string(h.num_fields) +
           " fields) has sizes out of range or columns outside the file";
  }
  if (std::string layout = LayoutProblem(h, size); !layout.empty()) return "has a damaged header: " + layout;
  if (h.max_times_sampled > kMaxTimesSampledLimit) {
    return "has a damaged header: max_times_sampled " + std::to_string(h.max_times_sampled) +
           " is out of range";
  }
  return {};
}

}  // namespace gear
