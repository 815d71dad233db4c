// xla_ffi/table_layout.h: where a table's columns go, and which headers an attach accepts.
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "xla_ffi/table_layout.h"

namespace gear {
namespace {

BOOST_AUTO_TEST_SUITE(table_layout)

BOOST_AUTO_TEST_CASE(row_strides_are_16_byte_multiples_and_128_from_1_kib_on) {
  BOOST_TEST(RowStride(1) == 16);
  BOOST_TEST(RowStride(16) == 16);
  BOOST_TEST(RowStride(17) == 32);
  BOOST_TEST(RowStride(1008) == 1008);
  BOOST_TEST(RowStride(1023) == 1024);
  BOOST_TEST(RowStride(1024) == 1024);
  BOOST_TEST(RowStride(1025) == 1152);
}

BOOST_AUTO_TEST_CASE(columns_are_aligned_in_order_and_never_overlap) {
  const std::vector<int64_t> step_bytes = {4, 1, 300, 12};
  const int64_t capacity = 1000;
  const int32_t max_steps = 5;
  const TablePlan plan = PlanTable(capacity, max_steps, step_bytes, "{}");
  const TableHeader& h = plan.layout;
  BOOST_TEST(h.capacity == capacity);
  BOOST_TEST(h.max_steps == max_steps);
  BOOST_TEST(h.num_fields == 4);
  // (offset, bytes) of every column, in the order PlanTable places them.
  std::vector<std::pair<uint64_t, uint64_t>> columns = {
      {h.state_offset, capacity * 8},      {h.length_offset, capacity * 4},
      {h.insert_seq_offset, capacity * 8}, {h.times_sampled_offset, capacity * 4},
      {h.writer_pid_offset, capacity * 4}, {h.change_counts_offset, ChangeCounterCount(capacity) * 4},
  };
  for (int f = 0; f < h.num_fields; ++f) {
    BOOST_TEST(h.fields[f].step_bytes == step_bytes[f]);
    BOOST_TEST(h.fields[f].row_stride == RowStride(step_bytes[f] * max_steps));
    columns.push_back({h.fields[f].offset, capacity * h.fields[f].row_stride});
  }
  BOOST_TEST(columns.front().first >= sizeof(TableHeader));
  for (size_t c = 0; c < columns.size(); ++c) {
    BOOST_TEST(columns[c].first % kColumnAlign == 0);
    const uint64_t end = columns[c].first + columns[c].second;
    BOOST_TEST(end <= (c + 1 < columns.size() ? columns[c + 1].first : plan.total_bytes));
  }
  BOOST_TEST(plan.total_bytes % kColumnAlign == 0);
}

BOOST_AUTO_TEST_CASE(sizes_out_of_range_are_refused) {
  const std::vector<int64_t> one = {4};
  BOOST_CHECK_THROW(PlanTable(0, 1, one, ""), std::invalid_argument);
  BOOST_CHECK_THROW(PlanTable(int64_t{1} << 31, 1, one, ""), std::invalid_argument);
  BOOST_CHECK_THROW(PlanTable(8, 0, one, ""), std::invalid_argument);
  BOOST_CHECK_THROW(PlanTable(8, 1, {}, ""), std::invalid_argument);
  BOOST_CHECK_THROW(PlanTable(8, 1, std::vector<int64_t>(kMaxFields + 1, 4), ""), std::invalid_argument);
  BOOST_CHECK_THROW(PlanTable(8, 1, {4, 0}, ""), std::invalid_argument);
  BOOST_CHECK_THROW(PlanTable(INT32_MAX, 1 << 30, {int64_t{1} << 20}, ""), std::invalid_argument);
  BOOST_CHECK_THROW(PlanTable(8, 1, one, std::string(kSpecJsonCapacity, 'x')), std::invalid_argument);
  BOOST_CHECK_NO_THROW(PlanTable(8, 1, std::vector<int64_t>(kMaxFields, 4), ""));
}

// A table's memory as Create writes it, for HeaderProblem to judge.
struct PlannedMemory {
  explicit PlannedMemory(const TablePlan& plan)
      : bytes(plan.total_bytes), base(static_cast<uint8_t*>(std::aligned_alloc(kColumnAlign, bytes))) {
    std::memset(base.get(), 0, bytes);
    std::memcpy(header(), &plan.layout, sizeof(TableHeader));
    header()->format_version = kFormatVersion;
    header()->total_bytes = bytes;
    std::memcpy(header()->magic, kTableMagic, sizeof(kTableMagic));
  }
  TableHeader* header() { return reinterpret_cast<TableHeader*>(base.get()); }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  uint64_t bytes;
  std::unique_ptr<uint8_t, Free> base;
};

BOOST_AUTO_TEST_CASE(an_attach_accepts_exactly_the_planned_layout) {
  const TablePlan plan = PlanTable(64, 3, {4, 40}, "{}");
  PlannedMemory memory(plan);
  TableHeader& h = *memory.header();
  BOOST_TEST(HeaderProblem(h, memory.bytes) == "");

  auto problem_after = [&](auto change) {
    PlannedMemory damaged(plan);
    change(*damaged.header());
    return HeaderProblem(*damaged.header(), damaged.bytes);
  };
  auto contains = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.magic[0] = 'X'; }), "no gear_jax header"));
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.format_version = kFormatVersion - 1; }),
                      "has table format " + std::to_string(kFormatVersion - 1)));
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.total_bytes += 4096; }), "the file holds"));
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.spec_json_bytes = kSpecJsonCapacity; }),
                      "spec JSON length"));
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.capacity = 0; }), "sizes out of range"));
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.fields[1].offset = d.fields[0].offset; }),
                      "the column of field 1"));
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.length_offset = d.state_offset; }),
                      "row status columns are not where its layout puts them"));
  // A capacity the file is too small for: the columns end past it.
  BOOST_TEST(contains(problem_after([](TableHeader& d) { d.capacity *= 2; }), "damaged header"));
  BOOST_TEST(HeaderProblem(h, memory.bytes) == "");  // the original was never touched
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
}  // namespace gear
