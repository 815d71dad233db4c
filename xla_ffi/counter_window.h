// Counter windows. A table's counters `size` and `selectable` cannot change in the instruction that
// changes a row, so every change that moves a row in or out of them is bracketed by a window that the
// process announces in its writer slot of the header: a process killed inside one leaves the window open
// there, and the counters are recounted from the rows (counter_window.cc, "Counters", has the argument
// for every instant a process can die). Claims, commits, inserts, priority updates (CPU and GPU) and
// their callers open windows only through CounterWindow, so that a window is closed on every way out of
// its scope, a throw included.
#pragma once

namespace gear {

class SharedTable;  // shared_table.h

// A counter window of this process on `table`, open from construction until destruction (or Close): a
// throw closes it; a kill does not, and that is the point. Movable, so that a window can outlive the
// scope that opened it (a CUDA handler hands it to the host callback that runs after its kernel).
class CounterWindow {
 public:
  explicit CounterWindow(SharedTable& table);
  ~CounterWindow() { Close(); }
  CounterWindow(CounterWindow&& other) noexcept : table_(other.table_), slot_(other.slot_) {
    other.table_ = nullptr;
  }
  CounterWindow(const CounterWindow&) = delete;
  CounterWindow& operator=(const CounterWindow&) = delete;
  CounterWindow& operator=(CounterWindow&&) = delete;

  // Closes the window now (once; later calls and the destructor do nothing): before its table may go.
  void Close();
  // The writer slot the window is counted in (-1: none was free, counted in unslotted_windows).
  int slot() const { return slot_; }

 private:
  SharedTable* table_;  // null once closed or moved from
  int slot_;
};

}  // namespace gear
