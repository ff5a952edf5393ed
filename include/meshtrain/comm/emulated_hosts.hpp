#pragma once
// Emulated hosts: several ranks on one GPU through NCCL (MESHTRAIN_EMULATE_HOSTS=1, set by
// `jobs/local.sh --emulate-hosts`). NCCL refuses two ranks on one GPU ("Duplicate GPU
// detected") but accepts them when each claims a host of its own: NCCL_HOSTID names the host,
// so a name per world rank makes every rank a host, and they meet through sockets over
// loopback. Any layout then runs on a workstation with one GPU: exact, but its speed means
// nothing.
#include <string>

namespace meshtrain::comm {

struct EmulatedHosts {
  bool on = false;      // this rank claimed a host of its own
  std::string refusal;  // why the request cannot work here (empty: not refused)
};

// Reads MESHTRAIN_EMULATE_HOSTS; when set (not "0"), and the build has NCCL and every rank of
// the job is on this node, sets NCCL_HOSTID for this world rank (and NCCL_SOCKET_IFNAME=lo,
// NCCL_IB_DISABLE=1 unless set). Call before any NCCL communicator exists. The refusal is the
// same on every rank (it depends on the build and the job's shape only).
EmulatedHosts claim_emulated_host(int world_rank, int world_size, int ranks_on_node);

// For an emulated host, before Kokkos initialises device_id: its host threads block while they
// wait for the GPU (cudaDeviceScheduleBlockingSync) instead of spinning. Ranks sharing a GPU
// each kept about 1.7 CPU cores busy spinning: at 14 ranks on a 16-core machine the load
// average was 24 and every rank slowed (2026-12-05). A rank with a GPU of its own keeps the
// runtime's default, spinning, which answers soonest. False, changing nothing, where the flag
// cannot be set (host builds; a context already made on that device).
bool prefer_blocking_sync(int device_id);

}  // namespace meshtrain::comm
