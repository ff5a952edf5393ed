# shellcheck shell=bash
# Site environment for the Slurm jobs (sourced by slurm_common.sh before the launch). Everything
# is commented: uncomment what your centre documents, or point MESHTRAIN_SITE_ENV at your own
# copy. Debugging variables stay off for production runs (they cost start-up time and log volume).

# ---- NCCL (GPU collectives) -------------------------------------------------------------------
# export NCCL_SOCKET_IFNAME=ib0          # NCCL's bootstrap interface (ib0, hsn0, ^lo,docker)
# export NCCL_IB_HCA=mlx5_0,mlx5_1       # InfiniBand adapters NCCL may use (one per GPU pair, typ.)
# export NCCL_NET_GDR_LEVEL=PHB          # GPUDirect RDMA when GPU and NIC share a PCIe host bridge
# export NCCL_CROSS_NIC=1                # rings may leave through a different NIC than they came in
# export NCCL_IB_TIMEOUT=22              # longer IB timeout on large or busy fabrics
# export NCCL_NVLS_ENABLE=0              # NVLink SHARP (multicast) off where the fabric lacks it
# export NCCL_P2P_LEVEL=NVL              # peer-to-peer only over NVLink
# Slingshot (HPE Cray) with the aws-ofi-nccl plugin:
# export FI_PROVIDER=cxi NCCL_NET="AWS Libfabric" FI_CXI_DISABLE_HOST_REGISTER=1
# Debugging (off):
# export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET  # which transport each ring uses
# export NCCL_DEBUG_FILE=nccl.%h.%p.log

# ---- Open MPI / UCX (host collectives, MPI-IO checkpoints) -------------------------------------
# export OMPI_MCA_pml=ucx                # InfiniBand through UCX
# export OMPI_MCA_btl=^openib,tcp        # no legacy verbs BTL, no TCP between nodes
# export UCX_NET_DEVICES=mlx5_0:1        # the port UCX uses
# export UCX_TLS=rc,sm,self              # transports
# export OMPI_MCA_io=romio321            # ROMIO for MPI-IO (HDF5 checkpoints) where OMPIO is slow
# export ROMIO_HINTS=$PWD/romio_hints    # e.g. striping_factor / cb_nodes for Lustre
# Debugging (off):
# export OMPI_MCA_mpi_show_mca_params=all OMPI_MCA_pml_base_verbose=10

# ---- Host threads ------------------------------------------------------------------------------
# slurm_common.sh sets OMP_NUM_THREADS and OPENBLAS_NUM_THREADS to the CPUs per rank unless set.
# export OMP_PROC_BIND=spread OMP_PLACES=threads
