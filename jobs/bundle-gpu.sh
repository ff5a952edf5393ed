#!/usr/bin/env bash
# Bundle built executables with the shared libraries a GPU machine may lack (parallel HDF5,
# Boost.Program_options, their dependencies), for machines that have CUDA, NCCL, cuBLAS and a
# compatible Open MPI but not our build dependencies.
#   jobs/bundle-gpu.sh OUT_DIR EXE [EXE...]
# Then on the GPU machine:  source OUT_DIR/env.sh; OUT_DIR/bin/EXE ...
# env.sh puts OUT_DIR/lib on LD_LIBRARY_PATH and finds cuDNN 9 (loaded at run time by the cuDNN
# attention path): the machine's own, else the nvidia-cudnn-cu13 (or -cu12) wheel of its Python.
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
cat > "$out/env.sh" <<'ENV'
# Source me: the bundle's libraries, then cuDNN 9 for --attn.impl auto|cudnn.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH=$here/lib:${LD_LIBRARY_PATH:-}
if [ -z "${MESHTRAIN_CUDNN_LIB_DIR:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 '; then
  for py in python3 python; do
    d=$("$py" -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null) || continue
    if [ -e "$d/libcudnn.so.9" ]; then export MESHTRAIN_CUDNN_LIB_DIR=$d; break; fi
  done
fi
if [ -n "${MESHTRAIN_CUDNN_LIB_DIR:-}" ]; then
  # The dispatcher libcudnn.so.9 loads its engine libraries from the library path.
  export LD_LIBRARY_PATH=$MESHTRAIN_CUDNN_LIB_DIR:$LD_LIBRARY_PATH
  echo "env.sh: cuDNN from $MESHTRAIN_CUDNN_LIB_DIR" >&2
fi
ENV
echo "bundled $(find "$out/bin" -type f | wc -l) executable(s) and $(find "$out/lib" -type f | wc -l) libraries into $out ($(du -sh "$out" | cut -f1))"
