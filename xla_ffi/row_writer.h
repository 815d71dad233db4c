// The short path of one-row writes from Python (Table.add, EpisodeWriter.append): one step of every field,
// given as Python scalars, numpy scalars or arrays, checked and converted without numpy and copied into
// the row. A value the short path does not take (another kind, a non-contiguous array, a dtype it does
// not convert) makes Pack return false and the caller goes the general way (gear_jax/casting.py), which
// casts or refuses with a message; both apply the same casting policy, so the path taken never changes
// what is stored or refused.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xla_ffi/open_table.h"

namespace gear {

// True when numpy casts values of (src_kind, src_size) into (dst_kind, dst_size) safely: a bool into
// anything numeric, an integer or float into a wider one of its kind, an unsigned into a wider signed
// integer, an integer of 1 or 2 bytes into float32 and of up to 4 into float64. Kinds as numpy's ('b',
// 'i', 'u', 'f').
bool SafeCast(char src_kind, int32_t src_size, char dst_kind, int32_t dst_size);

// Converts `count` contiguous elements of (src_kind, src_size) into (dst_kind, dst_size) under the "fit"
// casting policy (gear_jax/casting.py): within a kind when every value fits (integers in range, floats
// that do not overflow to infinity), and the safe casts across kinds (bools into anything numeric,
// small integers into floats). False when the pair is not converted here or a value does not fit; the
// caller then takes the general path, which casts or refuses with a message.
bool ConvertElements(const uint8_t* src, char src_kind, int32_t src_size, uint8_t* dst, char dst_kind,
                     int32_t dst_size, int64_t count);

// A field as the short path sees it: numpy's kind ('b' bool, 'i' signed, 'u' unsigned, 'f' float; anything
// else never takes the short path), the element size and the step's shape.
struct StepFieldType {
  char kind;
  int32_t itemsize;
  std::vector<int64_t> shape;
};

class RowWriter {
 public:
  // `table` is the gear_jax._native.NativeTable (an OpenTable) the rows go to; `names` and `types` list
  // the fields in layout order.
  RowWriter(pybind11::object table, std::vector<std::string> names, std::vector<StepFieldType> types);
  ~RowWriter() { Release(); }
  RowWriter(const RowWriter&) = delete;
  RowWriter& operator=(const RowWriter&) = delete;

  // Checks and converts `step` (a dict of every field name to one step's value) under the casting
  // policy ("strict": only the field's own dtype for typed values; strided arrays are gathered in C
  // order first). True when every value took the short path; the packed step is then held until
  // WritePacked or the next Pack.
  // `batch_axis`: whether values may come with a leading batch axis of size 1 (a batch of one row, as a
  // vector environment of one environment hands it out): kNone never (a step), kAllOrNone every value
  // or none (Table.add), kRequired every value (Table.insert of one row).
  enum BatchAxis : int32_t { kNone = 0, kAllOrNone = 1, kRequired = 2 };
  bool Pack(pybind11::handle step, bool strict, int32_t batch_axis = kNone);
  // Copies the packed step into step `step` of `row` (a row this process holds).
  void WritePacked(int64_t row, int32_t step);
  // Pack, wait for the table's rate limiter to admit one insert (up to `timeout` seconds; None: no
  // limit), claim a row, write step 0, commit it with length 1 and `priority`. Returns the row, -1 when
  // the general path must run instead (nothing claimed or written), -2 when the table is closed.
  int64_t Add(pybind11::handle row, bool strict, double priority, std::optional<double> timeout,
              int32_t batch_axis = kNone);

  // Step rings take whole episodes: a writer stages its episode in this process's memory, one step of
  // every field after the other, and inserts it at its end (nothing is in the table before: a writer
  // killed meanwhile leaves nothing behind). StagePacked appends the packed step; StageStep appends
  // one step given as one C-contiguous buffer of the field's step bytes per field (the general path's
  // converted values). Both throw std::length_error past max_steps.
  void StagePacked();
  void StageStep(const std::vector<pybind11::buffer>& values);
  int32_t staged_steps() const { return staged_steps_; }
  // Replaces the staged values of field `field` with `values`: one C-contiguous buffer of staged_steps()
  // steps of the field (a field known only when the episode ends, e.g. return-to-go). Throws
  // std::invalid_argument on another size or layout, leaving the staging as it was.
  void ReplaceStaged(int32_t field, const pybind11::buffer& values);
  // Inserts the staged episode with `priority` (admitted by the rate limiter first, waiting up to
  // `timeout`), empties the staging and returns the episode's row. A throw (a timeout, a closed table)
  // keeps the episode staged.
  int64_t CommitStaged(float priority, std::optional<double> timeout);
  void DropStaged();

 private:
  void CheckStageRoom();
  void Release();
  bool Refuse() {  // the general path must run: nothing packed
    Release();
    return false;
  }

  pybind11::object table_object_;
  OpenTable* table_;
  std::vector<pybind11::object> names_;
  std::vector<StepFieldType> types_;
  std::vector<int64_t> step_bytes_;
  std::vector<int64_t> staging_offset_;
  std::vector<uint8_t> staging_;               // converted values, one step of every field
  std::vector<const uint8_t*> source_;         // per field: into a held buffer, staging_ or strided_
  std::vector<std::vector<uint8_t>> strided_;  // per field: a strided value's elements in C order
  std::vector<Py_buffer> buffers_;
  std::vector<bool> buffer_held_;
  bool packed_ = false;
  std::vector<std::vector<uint8_t>> episode_;  // per field: the staged steps, back to back
  int32_t staged_steps_ = 0;
};

}  // namespace gear
