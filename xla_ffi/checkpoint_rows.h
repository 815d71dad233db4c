// What a checkpoint (gear_jax/checkpoint.py) reads from and writes into a table's rows beyond their
// bytes: a save reads row states as a seqlock reader does, and a load publishes the saved states and
// cursors of a new table's rows, so that every field byte is visible before the state that makes a row
// selectable.
#pragma once

#include <cstdint>

#include "xla_ffi/shared_table.h"

namespace gear {

// The row states [start, start + count) into out[0, count), each loaded with acquire after an acquire
// fence: a save reads states, copies the rows' fields, then reads the states again, and the fence keeps
// the copy's loads before the second read (a seqlock reader's order). Throws std::out_of_range for rows
// outside the table.
void ReadRowStates(const TableView& view, int64_t start, int64_t count, uint64_t* out);

// ReadRowStates for the rows rows[0, count), which need not be contiguous: a save of a step ring checks
// the episodes whose steps it copied, and those lie in any rows of the index. Throws std::out_of_range
// for a row outside the table.
void ReadRowStatesAt(const TableView& view, const int64_t* rows, int64_t count, uint64_t* out);

// A save of a step ring: copies the steps [starts[i], starts[i] + counts[i]) (sequence numbers, step n in
// ring slot n % step_capacity, so that a piece may wrap the ring's end) of every field f into out[f],
// the pieces back to back, so that a checkpoint stores each episode's own steps and nothing of the rest
// of the ring. Plain loads, as a seqlock reader's copy: the caller reads the episodes' states before
// (ReadRowStates) and after (ReadRowStatesAt) and keeps only the pieces of episodes whose generation
// did not change. Throws std::invalid_argument for a table without a ring or a count outside
// [0, step_capacity]; out[f] must hold the sum of counts steps of field f.
void CopyRingSteps(const TableView& view, const uint64_t* starts, const int64_t* counts, int64_t pieces,
                   uint8_t* const* out);

// A load, after it wrote rows' fields and status: publishes their saved state words states[0, count)
// (even generations) into rows [start, start + count) by compare-and-swap from the state of a new
// table's rows (0), so the fields are visible before the state (release). A row a writer of another
// process took meanwhile keeps that writer's state. Returns how many rows were not published for that
// reason. Throws std::out_of_range for rows outside the table.
int64_t PublishRestoredRows(const TableView& view, int64_t start, const uint64_t* states, int64_t count);

// PublishRestoredRows for the rows rows[0, count), which need not be contiguous: a step ring's episodes
// are restored into the rows they were saved from. Throws std::out_of_range for a row outside the table
// (before it publishes any).
int64_t PublishRestoredRowsAt(const TableView& view, const int64_t* rows, const uint64_t* states,
                              int64_t count);

// A load, after every row: sets the allocation cursor to the saved one and raises the insert_seq counter
// to the saved one, then recounts size and selectable from the rows (marked off as after a writer's
// death, so that a recount overlapped by another process's writes is tried again later).
void RestoreCursors(SharedTable& table, uint64_t next_seq, uint64_t commit_seq);

// A load of a step ring, before it publishes any episode: raises the step cursor (next_step) to the end
// of the restored steps, which lie at sequence numbers [0, next_step) of the new table's ring, so that
// the next insert claims the steps after them and retires the restored episodes oldest first when it
// needs their slots (a new table's retire marks, 0, are below every restored step: nothing is retired
// that the ring still holds). Throws std::invalid_argument for a table without a ring or a cursor past
// step_capacity.
void RestoreStepCursor(SharedTable& table, uint64_t next_step);

}  // namespace gear
