// Plain views of a gear_jax table's memory, shared by the CPU and CUDA kernels.
//
// A table is one mapping: a header, the per-row status columns and one column per field. The kernels
// see it through TableView, built by the runtime (xla_ffi/) from the header; they never know where the
// memory came from (shared memory on the host, or the same memory mapped into a GPU's address space).
//
// Row status. The generation and the priority share one 64-bit word, `state`:
//   state = (uint64 generation << 32) | bits of float32 priority
// so that a writer's claim (generation even -> odd, priority -> 0) and a priority update (priority
// changes only if the generation is still the sampled one) are each a single compare-and-swap. An odd
// generation marks a row being written (a seqlock); a row is selectable when its generation is even and
// its priority is > 0. Every other column is published before the even generation (release order).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GEAR_HD __host__ __device__ __forceinline__
#else
#define GEAR_HD inline
#endif

namespace gear {

inline constexpr int kMaxFields = 64;

// The selection methods. Python learns their names and numbers from the native module (kSampleMethods
// in sample.h), so this is their one definition.
enum class SampleMethod : int32_t { kUniform = 0, kPrioritized = 1, kFifo = 2, kLifo = 3, kTopK = 4 };

struct FieldView {
  uint8_t* data;       // first byte of row 0, step 0 (a step ring: of ring slot 0)
  int64_t row_stride;  // bytes between rows (>= max_steps * step_bytes, 16-byte multiple); 0 in a step ring
  int64_t step_bytes;  // bytes of one step of this field
};

struct TableView {
  int64_t capacity = 0;
  int32_t max_steps = 0;
  int32_t num_fields = 0;
  uint64_t* state = nullptr;          // [capacity] generation << 32 | priority bits
  int32_t* length = nullptr;          // [capacity] committed steps
  uint64_t* insert_seq = nullptr;     // [capacity] commit order (1, 2, ...), for fifo/lifo
  uint32_t* times_sampled = nullptr;  // [capacity]
  // Change counters (ChangeCounters below): [ChangeCounterCount(capacity)], level 0 first.
  uint32_t* change_counts = nullptr;
  const uint64_t* next_seq = nullptr;     // allocation cursor: rows [0, min(next_seq, capacity)) were claimed
  int64_t* selectable = nullptr;          // count of rows with an even generation and priority > 0
  uint32_t* max_priority_bits = nullptr;  // the largest priority so far (float32 bits; only raised)
  // Tables created with max_times_sampled (0: no limit): a row's contents are retired (priority 0, the
  // slot reusable) by the sample that uses up its last one, and times_sampled holds a SampleBudgetWord.
  uint32_t max_times_sampled = 0;
  // Whether a kernel may use read-modify-write atomics on this memory: true on the host (CPU atomics) and
  // on a device with native host atomics; false for pinned host memory over PCIe, where a GPU atomic is
  // not atomic against the CPU's and compute-sanitizer reports it as an invalid system-scoped atomic.
  bool read_modify_write_atomics = true;
  // Step-ring tables (step_capacity > 0): the steps of every episode lie back to back in one ring of
  // step_capacity steps per field, and a row is an episode of the index: first_step[row] is the 64-bit
  // sequence number of its first step, whose slot in the ring is the number modulo step_capacity (so an
  // episode may wrap the ring's end). 0 and null for tables of padded rows.
  int64_t step_capacity = 0;
  uint64_t* first_step = nullptr;  // [capacity]
  int32_t* longest = nullptr;      // the longest row (episode) published so far (only raised: RaiseLongest)
  FieldView fields[kMaxFields];
};

// Where `steps` steps of a field start at step `start` of `row` (first_step: the row's first step, read
// inside the row's seqlock; ignored for padded rows): the first `*first_steps` of them at `*first`, the
// rest at the start of the ring (a window that wraps the ring's end comes in two pieces).
GEAR_HD const uint8_t* StepSource(const TableView& t, const FieldView& field, int64_t row,
                                  uint64_t first_step, int64_t start, int64_t steps, int64_t* first_steps) {
  if (t.step_capacity == 0) {
    *first_steps = steps;
    return field.data + row * field.row_stride + start * field.step_bytes;
  }
  const uint64_t ring = static_cast<uint64_t>(t.step_capacity);
  const int64_t slot = static_cast<int64_t>((first_step + static_cast<uint64_t>(start)) % ring);
  const int64_t to_end = t.step_capacity - slot;
  *first_steps = steps < to_end ? steps : to_end;
  return field.data + slot * field.step_bytes;
}

// Change counters: which rows' state words changed, for the processes that keep an index over the
// priorities (priority_index.h) and must find what changed since they last looked without reading every
// row. Three levels of uint32 counters: level k counts the state changes of each group of
// 2^ChangeShift(k) rows (16, 1,024 and 65,536 rows). Whoever changes a row's state word raises the
// counter of its group at level 0, then at level 1, then at level 2 (NoteRowChanged, NoteRowsChanged:
// atomic adds, each after the state change). A reader loads a level-2 counter before the level-1
// counters under it, those before the level-0 counters under them, and those before the rows' state
// words: a change it missed has raised a counter it will see raised on its next look. (A counter
// wraps after 2^32 changes of its group between two looks, which no writer comes near.)
inline constexpr int kChangeLevels = 3;
GEAR_HD int ChangeShift(int level) { return 4 + 6 * level; }

GEAR_HD int64_t ChangeGroups(int64_t capacity, int level) {
  return (capacity + (int64_t{1} << ChangeShift(level)) - 1) >> ChangeShift(level);
}
// Where level `level` starts in the change-counter column.
GEAR_HD int64_t ChangeLevelStart(int64_t capacity, int level) {
  int64_t start = 0;
  for (int k = 0; k < level; ++k) start += ChangeGroups(capacity, k);
  return start;
}
GEAR_HD int64_t ChangeCounterCount(int64_t capacity) { return ChangeLevelStart(capacity, kChangeLevels); }

GEAR_HD uint32_t StateGeneration(uint64_t state) { return static_cast<uint32_t>(state >> 32); }

GEAR_HD float StatePriority(uint64_t state) {
  uint32_t bits = static_cast<uint32_t>(state);
  float p;
  memcpy(&p, &bits, sizeof(p));
  return p;
}

GEAR_HD uint64_t MakeState(uint32_t generation, float priority) {
  uint32_t bits;
  memcpy(&bits, &priority, sizeof(bits));
  return (static_cast<uint64_t>(generation) << 32) | bits;
}

GEAR_HD bool StateSelectable(uint64_t state) {
  return (StateGeneration(state) & 1u) == 0 && StatePriority(state) > 0.0f;
}

// A limited table's times_sampled word (max_times_sampled > 0): the samples taken of a row's current
// contents in the low 16 bits, tagged in the high 16 with the contents' generation, so that a sampler
// that picked the row before a writer took it over can never count against the new contents (its
// compare-and-swap expects the old tag). The writer of a row stores the word of the generation it will
// publish, with a count of 0, while the row is odd (xla_ffi/row_protocol.cc).
inline constexpr uint32_t kMaxTimesSampledLimit = 0xFFFFu;
GEAR_HD uint32_t SampleBudgetWord(uint32_t generation, uint32_t count) {
  return (((generation >> 1) & 0xFFFFu) << 16) | count;
}
GEAR_HD uint32_t SampleBudgetCount(uint32_t word) { return word & 0xFFFFu; }
// Whether `word` counts the samples of the contents of `generation`.
GEAR_HD bool SampleBudgetOf(uint32_t word, uint32_t generation) {
  return (word & 0xFFFF0000u) == (SampleBudgetWord(generation, 0) & 0xFFFF0000u);
}

// Whether a row's length is one a writer can publish: [1, max_steps]. The length column is data of the
// shared file, not layout: a row of any other length (an abandoned row, or a damaged or forged file) is
// never selected, never made selectable and never gathered as valid, so that no read leaves its row.
GEAR_HD bool LengthInRange(int32_t length, int32_t max_steps) { return length >= 1 && length <= max_steps; }

}  // namespace gear
