#!/usr/bin/env bash
# Builds the Hopper tile sweep (benches/sm90_sweep/): one translation unit per candidate of
# candidates.inc (the kernel template of cpp/src/sm90/, bf16, SASS sm_90a), compiled with at most
# FLASHCORE_NVCC_JOBS nvcc at once (default 2; ~3 GB each), linked with sweep.cu into
# dist/sm90-sweep (static cudart). Needs the toolchain that the cargo build provisions into
# third_party/. On the GPU host: dist/sm90-sweep [ITERS] prints the table the sm90 rows are
# chosen from.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc="${NVCC:-third_party/cuda/bin/nvcc}"
cutlass="${CUTLASS_DIR:-third_party/cutlass}"
out=target/sm90-sweep
mkdir -p "$out" dist
# CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED: without it CuTe picks wgmma widths of powers of two
# (and 96 and 192) only, so a 176-key tile's QK product ran as eleven n = 16 wgmmas (round 46).
flags=(-std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  -Xcudafe=--diag_suppress=esa_on_defaulted_function_ignored
  -gencode=arch=compute_90a,code=sm_90a -Icpp/include -Icpp/src -Ibenches/sm90_sweep
  "-I$cutlass/include" "-I$cutlass/tools/util/include" "-I$cutlass/examples/88_hopper_fmha")
units=()
while read -r q k d p; do
  name="q${q}_k${k}_d${d}_${p}"
  cat >"$out/$name.cu" <<CU
#include "sm90/launch.cuh"
void sweep_${name}(const flashcore::FmhaArgs& a, cudaStream_t s) {
  flashcore::sm90::launch_sm90<cutlass::bfloat16_t, $q, $k, $d, $p>(a, s);
}
CU
  units+=("$name")
done < <(sed -n 's/^CANDIDATE(\([0-9]*\), *\([0-9]*\), *\([0-9]*\), *\([0-9]*\))$/\1 \2 \3 \4/p' \
  benches/sm90_sweep/candidates.inc)
printf '%s\n' "${units[@]}" | xargs -P "${FLASHCORE_NVCC_JOBS:-2}" -I{} \
  "$nvcc" "${flags[@]}" -c "$out/{}.cu" -o "$out/{}.o"
objects=()
for u in "${units[@]}"; do objects+=("$out/$u.o"); done
"$nvcc" "${flags[@]}" benches/sm90_sweep/sweep.cu "${objects[@]}" -o dist/sm90-sweep -cudart static
echo "built dist/sm90-sweep (${#units[@]} candidates)"
