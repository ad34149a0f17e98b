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
    # The device tool brings back only a few files: pack everything into one archive beside the folder.
    tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" && echo "packed $out.tgz"
    exit "$status"
    ;;
*)
    echo "usage: $0 bundle | run [/path/to/libnccl.so.2] | /path/to/libnccl.so.2" >&2
    exit 2
    ;;
esac
