// Internal: departure notices, so a rank that leaves the job without a failure MPI can see
// does not leave its peers waiting out the op timeout.
//
// Why: a rank that hits an error of its own (say DDP's unused-parameter error on rank 1
// only), catches it and returns from main sits in MPI_Finalize, which waits for every
// rank. Its process is alive, so neither MPI nor the pid watch sees a failure, and its
// peers wait in the collective it never entered until the op timeout (300 s by default).
// So, where lockstep initialized MPI (and so runs MPI_Finalize at exit), every rank tells
// every other, just before MPI_Finalize, that it leaves: its exit status and, for each
// mpi group of the process, the last collective it entered. A peer waiting in collective
// #s of group g that hears that a member left after its #k < s knows the member will
// never come: the op fails at once with CommError(PeerGone) naming it. A member that left
// after entering #s (a job that ends normally) does not fail anybody.
//
// Groups are numbered in creation order, the same on every rank (creation is collective
// over MPI_COMM_WORLD). Point-to-point ops, and groups past kMaxGroups, have no number
// to compare: they fail when the peer left more than kUnnumberedGrace ago and the op
// still waits. The notices travel on a duplicate of MPI_COMM_WORLD of their own.
#pragma once

#include <lockstep/comm/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::comm::mpi {

constexpr int kMaxGroups = 30;
constexpr Millis kUnnumberedGrace{1000};

// Right after lockstep's own MPI_Init: the notices' communicator and the first receive.
// Collective over MPI_COMM_WORLD. Call with call_lock() held.
void start_departures_locked();

// A number for a new mpi group (0, 1, ...), or -1 when departures are off (MPI was
// initialized by the program) or past kMaxGroups. Call with call_lock() held.
int register_group_locked();

// This rank entered collective `seq` of group `group` (-1: nothing recorded). Any thread.
void entered(int group, uint64_t seq) noexcept;

// The member of group `group` (world_ranks: its members' world ranks, in group order;
// empty: the group is the world) that left the job and will not take part in the op
// waiting since `op_start` (collective `seq`, or 0 for point to point): its rank in the
// group, with "rank R left the job ..." in *what; -1 if none. Polls for notices; takes
// call_lock().
int departed_member(int group, uint64_t seq, Clock::time_point op_start,
                    const std::vector<int>& world_ranks, std::string* what);

// Tells every other rank that this one leaves with `status` (before MPI_Finalize), and
// withdraws this rank's own receive. Call with call_lock() held; never throws.
void announce_departure_locked(int status) noexcept;

}  // namespace lockstep::comm::mpi
