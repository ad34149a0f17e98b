#!/usr/bin/env bash
# GPU validation of the NCCL device backend, in two halves (see docs/gpu-validation.md):
#
#   scripts/gpu-validation.sh bundle    # on a machine with Rust: build the binaries into gpu-bin/
#   bash gpu-bin/run.sh [LIBNCCL]       # on the GPU machine (no Rust needed): run them, logs into $OUT
#
# LIBNCCL, when given, is the NCCL to test (e.g. /tmp/nccl/build/lib/libnccl.so.2 from ../shared/gpu/build-nccl.sh);
# with NCCL 2.30 or newer the run also sets NCCL_MULTI_RANK_GPU_ENABLE=1, so the two-rank tests run on one GPU,
# and benchmarks two ranks too. Every test runs with HYPERCOMM_REQUIRE_GPU=1: a skip is a failure.
#
# gpu-bin/ is ignored by git (.gitignore); name it in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
bundle)
    rm -rf gpu-bin && mkdir -p gpu-bin
    # The test binary's path comes from cargo itself, not from guessing at target/release/deps.
    cargo test --release -p hypercomm-comm --test gpu --no-run --message-format=json \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])
' >gpu-bin/.test-path
    cp "$(cat gpu-bin/.test-path)" gpu-bin/gpu-tests && rm gpu-bin/.test-path
    cargo build --release -p hypercomm-cli
    cp target/release/hypercomm gpu-bin/hypercomm
    cp scripts/gpu-validation.sh gpu-bin/run.sh
    # candle's CUDA tensors (hypercomm's feature `cuda`): only where nvcc is on PATH, since candle's CUDA backend
    # compiles its kernels with it. CUDA_COMPUTE_CAP picks the GPU (90: Hopper). A target folder of its own: the
    # feature links cudarc against the CUDA libraries, which rebuilds everything below it.
    if command -v nvcc >/dev/null; then
        export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
        cuda_target="${CUDA_TARGET_DIR:-target/cuda}"
        CARGO_TARGET_DIR="$cuda_target" cargo test --release -p hypercomm-candle --features cuda --test gpu \
            --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])
' >gpu-bin/.candle-path
        cp "$(cat gpu-bin/.candle-path)" gpu-bin/candle-gpu-tests && rm gpu-bin/.candle-path
        CARGO_TARGET_DIR="$cuda_target" cargo build --release --features cuda --example candle_dp_tp
        cp "$cuda_target/release/examples/candle_dp_tp" gpu-bin/candle_dp_tp
        # Each is ~55 MB (candle's kernels inside), past what the device tool carries; packed they are ~12 MB.
        strip gpu-bin/candle-gpu-tests gpu-bin/candle_dp_tp
        tar cJf gpu-bin/candle-bins.tar.xz -C gpu-bin candle-gpu-tests candle_dp_tp
        rm gpu-bin/candle-gpu-tests gpu-bin/candle_dp_tp
    else
        echo "no nvcc on PATH: gpu-bin/ has no candle CUDA binaries (see docs/gpu-validation.md)"
    fi
    echo "gpu-bin/ ready: $(ls gpu-bin | tr '\n' ' ')"
    ;;
"" | run | /*)
    # On the GPU machine, from the repository root or from gpu-bin/.
    bin="$(cd "$(dirname "$0")" && pwd)"
    [ -x "$bin/gpu-tests" ] || bin="$PWD/gpu-bin"
    out="${OUT:-$PWD/gpu-out}"
    mkdir -p "$out"
    # NVRTC (for the pack and fill/verify kernels): the folder of libnvrtc.so.13 from an installed CUDA wheel or
    # toolkit. NCCL is found by the loader itself (NCCL_LIBRARY, the soname, then Python's nvidia/nccl/lib).
    nvrtc="$(python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + ["/usr/local/cuda/lib64"]
for root in roots:
    hits = sorted(glob.glob(root + "/**/libnvrtc.so.13*", recursive=True))
    if hits:
        print(hits[0].rsplit("/", 1)[0]); sys.exit(0)
PY
)"
    [ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$nvrtc:${LD_LIBRARY_PATH:-}"
    ranks=(1)
    lib=""
    case "${1:-}" in run) lib="${2:-}" ;; /*) lib="$1" ;; esac
    if [ -n "$lib" ]; then
        [ -f "$lib" ] || { echo "run.sh: no nccl library at $lib" >&2; exit 2; }
        export NCCL_LIBRARY="$lib"
        # Two ranks on one GPU need NCCL 2.30+ (the tests and the bench check the version themselves).
        export NCCL_MULTI_RANK_GPU_ENABLE=1
        ranks=(1 2)
    fi
    export HYPERCOMM_REQUIRE_GPU=1
    {
        date -u +"%Y-%m-%dT%H:%M:%SZ"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
        echo "nvrtc folder: ${nvrtc:-not found}"
        echo "NCCL_LIBRARY: ${NCCL_LIBRARY:-unset, found by the loader search}"
    } | tee "$out/machine.txt"
    status=0
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "$bin/gpu-tests" --nocapture --test-threads=1 \
        >"$out/gpu-tests.log" 2>&1 || status=$?
    grep -E "^test |test result|skipping|panicked" "$out/gpu-tests.log" || true
    for n in "${ranks[@]}"; do
        for op in all_reduce all_gather reduce_scatter; do
            "$bin/hypercomm" bench --backend nccl -n "$n" --op "$op" --sizes 8B:1GiB --overhead-batches 51 \
                --json "$out/bench-${n}rank-$op.json" --plot "$out/bench-${n}rank-$op.svg" 2>&1 \
                | tee "$out/bench-${n}rank-$op.log" || status=1
        done
        # The point-to-point benchmarks (docs/perf/point-to-point.md); a ring needs two ranks.
        if [ "$n" -gt 1 ]; then
            for op in sendrecv all_to_all_v; do
                "$bin/hypercomm" bench --backend nccl -n "$n" --op "$op" --sizes 8B:1GiB --overhead-calls 0 \
                    --json "$out/bench-${n}rank-$op.json" --plot "$out/bench-${n}rank-$op.svg" 2>&1 \
                    | tee "$out/bench-${n}rank-$op.log" || status=1
            done
        fi
        # The same all-reduce on blocking communicators: what NCCL's non-blocking mode costs per call.
        "$bin/hypercomm" bench --backend nccl -n "$n" --op all_reduce --sizes 8B:64MiB --overhead-batches 51 \
            --blocking --json "$out/bench-${n}rank-all_reduce-blocking.json" 2>&1 \
            | tee "$out/bench-${n}rank-all_reduce-blocking.log" || status=1
    done
    # Building a full collection (8 ranks, ~21 groups each) with an NCCL communicator per group, beside the host
    # figure: 8 ranks on one GPU need the 2.30 library.
    if [ "${#ranks[@]}" -gt 1 ]; then
        for backend in host nccl; do
            "$bin/hypercomm" bench --collection --backend "$backend" --repeats 3 \
                --json "$out/collection-$backend.json" 2>&1 | tee "$out/collection-$backend.log" || status=1
        done
    fi
    # candle's CUDA tensors through NCCL, when the bundle has them: the test binary, then the example on the GPU
    # against itself on the CPU (4 ranks when several ranks may share the GPU, else the single-rank run only).
    candle_bin=""
    if [ -f "$bin/candle-bins.tar.xz" ]; then
        candle_bin="$(mktemp -d)" && tar xJf "$bin/candle-bins.tar.xz" -C "$candle_bin"
    fi
    if [ -n "$candle_bin" ] && [ -x "$candle_bin/candle-gpu-tests" ]; then
        # candle links cublas, cublasLt and curand: the folders holding them in the machine's Python packages.
        culibs="$(python3 - <<'PY' 2>/dev/null || true
import glob, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = {h.rsplit("/", 1)[0] for r in roots for n in ("libcublas.so.13*", "libcurand.so.10*", "libcudart.so.13*")
        for h in glob.glob(r + "/**/" + n, recursive=True)}
print(":".join(sorted(dirs)))
PY
)"
        [ -n "$culibs" ] && export LD_LIBRARY_PATH="$culibs:${LD_LIBRARY_PATH:-}"
        "$candle_bin/candle-gpu-tests" --nocapture --test-threads=1 >"$out/candle-gpu-tests.log" 2>&1 || status=1
        # The never-joins tests print when each of rank 0's calls returned, and what it returned.
        grep -E "^test |test result|skipping|panicked|never join" "$out/candle-gpu-tests.log" || true
        layouts=("1 1")
        [ "${#ranks[@]}" -gt 1 ] && layouts+=("2 2")
        for l in "${layouts[@]}"; do
            set -- $l
            for dev in cpu cuda; do
                "$candle_bin/candle_dp_tp" --tp "$1" --dp "$2" --device "$dev" >"$out/candle-tp$1-dp$2-$dev.log" 2>&1 \
                    || status=1
            done
            python3 - "$out/candle-tp$1-dp$2-cpu.log" "$out/candle-tp$1-dp$2-cuda.log" <<'PY' || status=1
import sys
def numbers(path):
    return [float(l.split()[-1]) for l in open(path) if l.startswith(("step ", "final "))]
cpu, cuda = numbers(sys.argv[1]), numbers(sys.argv[2])
worst = max((abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, cuda)), default=float("inf"))
ok = len(cpu) == len(cuda) == 21 and worst <= 1e-5
print(f"candle example {sys.argv[2]}: {len(cuda)} numbers, worst relative difference from the cpu run {worst:.2e}",
      "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
        done
    fi
    # The device tool brings back only a few files: pack everything into one archive beside the folder.
    tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" && echo "packed $out.tgz"
    exit "$status"
    ;;
*)
    echo "usage: $0 bundle | run [/path/to/libnccl.so.2] | /path/to/libnccl.so.2" >&2
    exit 2
    ;;
esac
