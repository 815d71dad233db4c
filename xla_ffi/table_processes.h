// The processes that use a table, as the header records them: pids (owner words, writer and attach
// slots) judged alive or gone by kill(pid, 0) where this process can answer for them, the attach slots
// every open by attach signs in to, and forks (a child may write into every mapping it inherits).
//
// Attach and close: attaching processes sign in to a slot of the header; the creator marks the table
// closed before it reads the slots, and an attach reads the mark after it signs in, so one of the two
// always sees the other. Forks: table_processes.cc, "Forks".
#pragma once

#include <cstdint>

namespace gear {

struct TableHeader;  // table_layout.h
class TableMemory;   // table_mapping.h

// This process's pid (cached; reset in a forked child).
int32_t CurrentPid();
// Whether process `pid` (> 0) exists in this process's PID namespace, by kill(pid, 0).
bool ProcessAlive(int32_t pid);
// This process's PID namespace: the inode of /proc/self/ns/pid (cached; reset in a forked child), 0
// where it cannot be read.
uint64_t PidNamespace();
// Whether kill(pid, 0) answers for the pids recorded in table `h`: this process is in the creator's PID
// namespace (known), and no process of another namespace attached (mixed_pid_namespaces).
bool PidsComparable(const TableHeader* h);
// Whether the process `pid` recorded in table `h` (an owner word, a writer or attach slot) may still
// run: false only for pid <= 0 and for a pid kill(pid, 0) finds gone where PidsComparable(h). Containers
// that share /dev/shm but not a PID namespace see each other's processes as gone (or as others): their
// pids are unknown here, taken for alive, so nothing of theirs is reclaimed.
bool PidMayBeAlive(const TableHeader* h, int32_t pid);

// Signs process `me` in to a free attach slot of `h` (or one left by a dead process); -1 when every
// slot is taken (the table is then marked never to be reused).
int SignIn(TableHeader* h, int32_t me);
// Gives this process's attach slot `slot` (-1: none) back.
void SignOut(TableHeader* h, int slot);
// Whether a process other than the creator may still use table `h`: a signed-in attacher that is
// alive, or the never_reuse mark (more attachers than slots, or a fork).
bool AttachedElsewhere(const TableHeader* h);

// The mappings of this process, kept for forks ("Forks"): a TableMemory adds itself when it maps a file
// and removes itself before it unmaps it.
void TrackMapping(TableMemory* memory);
void UntrackMapping(TableMemory* memory);

}  // namespace gear
