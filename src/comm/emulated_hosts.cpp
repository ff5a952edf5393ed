#include "meshtrain/comm/emulated_hosts.hpp"

#include <Kokkos_Macros.hpp>  // KOKKOS_ENABLE_CUDA

#include <cstdlib>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include "meshtrain/core/error.hpp"

namespace meshtrain::comm {

EmulatedHosts claim_emulated_host(int world_rank, int world_size, int ranks_on_node) {
  EmulatedHosts h;
  const char* env = std::getenv("MESHTRAIN_EMULATE_HOSTS");
  if (!env || std::string(env).empty() || std::string(env) == "0") return h;
#if !defined(MESHTRAIN_HAVE_NCCL)
  (void)world_rank, (void)world_size, (void)ranks_on_node;
  h.refusal =
      "MESHTRAIN_EMULATE_HOSTS (jobs/local.sh --emulate-hosts) makes ranks share a GPU through "
      "NCCL; this is a build without NCCL (the CPU build's collectives are MPI's, which need no "
      "emulation): build the cuda preset, or leave it out";
#else
  if (ranks_on_node != world_size) {
    h.refusal = cat("MESHTRAIN_EMULATE_HOSTS (jobs/local.sh --emulate-hosts) makes every rank "
                    "of one node a host of its own; this job has ", world_size, " ranks of which ",
                    ranks_on_node, " share this node: run it on one node, or leave it out on a "
                    "real cluster");
    return h;
  }
  const std::string host = cat("meshtrain-emulated-host-", world_rank);
  setenv("NCCL_HOSTID", host.c_str(), 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);  // the loopback interface carries every transfer
  setenv("NCCL_IB_DISABLE", "1", 0);
  h.on = true;
#endif
  return h;
}

bool prefer_blocking_sync(int device_id) {
#if defined(KOKKOS_ENABLE_CUDA)
  if (device_id < 0) return false;
  if (cudaSetDevice(device_id) != cudaSuccess ||
      cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) != cudaSuccess) {
    cudaGetLastError();  // no sticky error left for Kokkos' initialisation
    return false;
  }
  return true;
#else
  (void)device_id;
  return false;
#endif
}

}  // namespace meshtrain::comm
