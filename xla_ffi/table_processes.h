// The processes that use a table, as the header records them: pids (owner words, writer and attach
// slots) judged alive or gone by kill(pid, 0) where this process can answer for them and by liveness
// locks where it cannot, the attach slots every open by attach signs in to, and forks (a child may write
// into every mapping it inherits).
//
// Liveness locks. kill(pid, 0) answers only for pids of the caller's PID namespace, and containers that
// share /dev/shm need not share one. So every process of gear_jax, from its first CurrentPid() (before
// it records its pid anywhere) for as long as it lives, holds a read lock on byte `pid` of one file,
// /dev/shm/gear_jax_liveness (empty: a lock may lie past the end of a file). It is an open file
// description's lock (F_OFD_SETLK), which the kernel drops when the last descriptor of that open file
// closes: when the process exits or is killed. Locks know no namespaces: a pid recorded in a table whose
// byte no process locks is of a process that is gone. That holds where every process that used the table
// held its lock in the same file: the creator records the file (device and inode) in the header, and a
// process that maps the table without holding a lock in that very file (it could not open or lock it,
// or the file was removed and made again) marks the table liveness_unproven, whose pids kill(pid, 0)
// cannot judge then count as alive. A pid of another namespace may equal a live process's pid here:
// then the dead one counts as alive too (never the other way round). A forked child takes the lock of
// its own pid before it signs in.
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
// run: false for pid <= 0, for a pid kill(pid, 0) finds gone where PidsComparable(h), and elsewhere for
// a pid whose liveness lock no process holds, unless the table is liveness_unproven (then true).
bool PidMayBeAlive(const TableHeader* h, int32_t pid);
// Where this process holds its liveness lock (CurrentPid() takes it): the file's device and inode;
// false when it holds none.
bool LivenessFile(uint64_t* device, uint64_t* inode);
// Marks `h` liveness_unproven unless this process holds its lock in the file `h` names. Called before
// this process records its pid in `h` (an attach, a forked child).
void ProveLiveness(TableHeader* h);

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
