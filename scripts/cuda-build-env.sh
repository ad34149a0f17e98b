#!/usr/bin/env bash
# A CUDA 13.0 build environment on a machine without a GPU or a CUDA toolkit, for hypercomm's feature `cuda`
# (candle's CUDA backend compiles its kernels with nvcc and links cuda, cublas, cublasLt, curand, nvrtc, cudart).
#
#   scripts/cuda-build-env.sh [PREFIX]        # once: installs into PREFIX (default /opt/hypercomm-cuda)
#   . PREFIX/env.sh                          # then, in the shell that builds
#   CUDA_TARGET_DIR=target/cuda scripts/gpu-validation.sh bundle
#
# Everything comes from NVIDIA's wheels on PyPI, pinned to CUDA 13.0 so that the PTX and cubins it makes load on a
# 13.0 driver (a newer nvcc writes a PTX version such a driver refuses). The one thing no wheel has is the driver
# library to link against: the real one comes with the GPU's driver. A stub stands in at link time only, exporting
# every `cu*` entry point cudarc declares (each returns an error code); its soname is libcuda.so.1, so the binary
# loads the real driver on the GPU machine.
set -euo pipefail
prefix="${1:-/opt/hypercomm-cuda}"
mkdir -p "$prefix"
pip install --quiet --target "$prefix/wheels" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 \
    nvidia-cuda-cccl==13.0.85 'nvidia-cublas==13.0.*' 'nvidia-curand==10.4.0.*' 'nvidia-cuda-nvrtc==13.0.*'
cu="$prefix/wheels/nvidia/cu13"
mkdir -p "$prefix/root/lib64" "$prefix/stub"
ln -sfn "$cu/bin" "$prefix/root/bin"
ln -sfn "$cu/include" "$prefix/root/include"
for lib in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libcudart.so.13; do
    ln -sf "$cu/lib/$lib" "$prefix/root/lib64/${lib%%.so*}.so"
done
# The stub driver: every cu* function cudarc's bindings name.
sys_rs="$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*cudarc-0.19*/src/driver/sys/mod.rs' | head -n 1)"
[ -n "$sys_rs" ] || { echo "cuda-build-env: run 'cargo fetch' first (cudarc's sources are needed)" >&2; exit 1; }
grep -oE "pub (unsafe )?fn cu[A-Za-z0-9_]+" "$sys_rs" | awk '{print $NF}' | sort -u \
    | sed 's/.*/int &(void) { return 999; }/' >"$prefix/stub/cuda_stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$prefix/root/lib64/libcuda.so" "$prefix/stub/cuda_stub.c"
ln -sf libcuda.so "$prefix/root/lib64/libcuda.so.1"
cat >"$prefix/env.sh" <<EOF
export CUDA_HOME="$prefix/root" PATH="$prefix/root/bin:\$PATH" CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-90}"
EOF
"$prefix/root/bin/nvcc" --version | tail -n 2
echo "ready: . $prefix/env.sh"
