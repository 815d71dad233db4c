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

// A load, after it wrote rows' fields and status: publishes their saved state words states[0, count)
// (even generations) into rows [start, start + count) by compare-and-swap from the state of a new
// table's rows (0), so the fields are visible before the state (release). A row a writer of another
// process took meanwhile keeps that writer's state. Returns how many rows were not published for that
// reason. Throws std::out_of_range for rows outside the table.
int64_t PublishRestoredRows(const TableView& view, int64_t start, const uint64_t* states, int64_t count);

// A load, after every row: sets the allocation cursor to the saved one and raises the insert_seq counter
// to the saved one, then recounts size and selectable from the rows (marked off as after a writer's
// death, so that a recount overlapped by another process's writes is tried again later).
void RestoreCursors(SharedTable& table, uint64_t next_seq, uint64_t commit_seq);

}  // namespace gear
