#!/usr/bin/env bash
# Bundle built executables with the shared libraries a GPU machine may lack (parallel HDF5,
# Boost.Program_options, their dependencies), for machines that have CUDA, NCCL, cuBLAS and a
# compatible Open MPI but not our build dependencies.
#   jobs/bundle-gpu.sh OUT_DIR EXE [EXE...]
# Then on the GPU machine:  LD_LIBRARY_PATH=OUT_DIR/lib:$LD_LIBRARY_PATH OUT_DIR/bin/EXE ...
# Left out on purpose: the C/C++ runtime, the CUDA driver, CUDA/NCCL/cuBLAS (the machine's own),
# and Open MPI (it must match the machine's mpirun/orted; 4.1.x is ABI-compatible).
set -euo pipefail
out=$1; shift
mkdir -p "$out/bin" "$out/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda\.so|libmpi|libopen-(pal|rte)|libnccl|libcublas|libcudart|libhwloc|libevent|libpmix|libfabric|libucx|libuc[pmst]|libibverbs|librdmacm|libnl-|libpsm|libefa|libmunge)'
for exe in "$@"; do
  cp "$exe" "$out/bin/"
  ldd "$exe" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -L "$path" "$out/lib/"; fi
  done
done
echo "bundled $(find "$out/bin" -type f | wc -l) executable(s) and $(find "$out/lib" -type f | wc -l) libraries into $out ($(du -sh "$out" | cut -f1))"
