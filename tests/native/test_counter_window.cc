// xla_ffi/counter_window.h: a counter window closes on every way out of its scope, a throwing kernel
// included, on a real table in /dev/shm.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "xla_ffi/shared_table.h"

namespace gear {
namespace {

// A small table of this test process, removed at the end.
struct TestTable {
  TestTable() {
    static int made = 0;
    const std::string name =
        "gear_jax_native_test_" + std::to_string(getpid()) + "_" + std::to_string(made++);
    table = SharedTable::Create(name, PlanTable(16, 1, {4}, "{}"), "{}", 0, /*pin=*/false);
  }
  ~TestTable() { table->Unlink(); }
  TableHeader* header() const { return table->header(); }
  // Windows this process has open on the table, as its writer slot counts them.
  uint32_t open_windows(int slot) const {
    return static_cast<uint32_t>(__atomic_load_n(&header()->writer_slots[slot], __ATOMIC_SEQ_CST) >> 32);
  }
  uint64_t opened() const { return __atomic_load_n(&header()->windows_opened, __ATOMIC_SEQ_CST); }
  std::shared_ptr<SharedTable> table;
};

// Stands for a kernel run inside a window that runs out of memory.
void ThrowingKernel() { throw std::bad_alloc(); }

BOOST_AUTO_TEST_SUITE(counter_window)

BOOST_AUTO_TEST_CASE(a_window_is_counted_in_the_writer_slot_while_open) {
  TestTable t;
  int slot = -1;
  {
    CounterWindow window(*t.table);
    slot = window.slot();
    BOOST_REQUIRE(slot >= 0);
    BOOST_TEST(t.open_windows(slot) == 1u);
    BOOST_TEST(t.opened() == 1u);
    CounterWindow nested(*t.table);
    BOOST_TEST(nested.slot() == slot);
    BOOST_TEST(t.open_windows(slot) == 2u);
  }
  BOOST_TEST(t.open_windows(slot) == 0u);
  BOOST_TEST(t.opened() == 2u);
}

BOOST_AUTO_TEST_CASE(a_window_closes_when_the_kernel_throws) {
  TestTable t;
  int slot = -1;
  BOOST_CHECK_THROW(
      {
        CounterWindow window(*t.table);
        slot = window.slot();
        ThrowingKernel();
      },
      std::bad_alloc);
  BOOST_REQUIRE(slot >= 0);
  BOOST_TEST(t.open_windows(slot) == 0u);
  BOOST_TEST(t.opened() == 1u);
  // The counters were left exact: no recount is due, and a writer's window opens and closes as usual.
  BOOST_TEST(t.header()->counts_dirty == 0u);
  const int64_t row = t.table->Claim();
  t.table->Commit(row, 1, 2.0f);
  BOOST_TEST(t.open_windows(slot) == 0u);
  BOOST_TEST(t.header()->size == 1);
  BOOST_TEST(t.header()->selectable == 1);
}

BOOST_AUTO_TEST_CASE(a_moved_window_stays_open_until_its_last_owner_closes_it_once) {
  TestTable t;
  auto outer = std::make_unique<CounterWindow>(*t.table);
  const int slot = outer->slot();
  {
    CounterWindow moved(std::move(*outer));
    outer.reset();  // the moved-from window closes nothing
    BOOST_TEST(t.open_windows(slot) == 1u);
    moved.Close();
    BOOST_TEST(t.open_windows(slot) == 0u);
    CounterWindow other(*t.table);  // keeps the slot busy: a second close would take this one's
    moved.Close();
    BOOST_TEST(t.open_windows(slot) == 1u);
  }
  BOOST_TEST(t.open_windows(slot) == 0u);
  BOOST_TEST(t.opened() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
}  // namespace gear
