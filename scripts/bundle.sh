#!/usr/bin/env bash
# Builds the GPU tests and examples (and benches, when present) as self-contained release binaries
# (cudart linked statically) into bundle/, plus the C++ example, with bundle/run.sh to run them on
# a GPU host that has no Rust toolchain. Criterion benches only with BUNDLE_CRITERION=1 (the
# transfer limit is 64 MiB). The C++ example links the C++ library that the cargo build compiled
# (build.rs's archives: the same sources, kernels from its content-hash cache, seconds); with
# BUNDLE_CMAKE=1 it is built through CMake instead (the standalone library, SASS for sm_90 only,
# every kernel compiled again: about 10 minutes on 2 cores).
# Usage: scripts/bundle.sh [extra cargo args]; then on the GPU host:
#   bash bundle/run.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf bundle && mkdir -p bundle
# With the Hopper bias kernels (feature sm90-bias), so that the GPU suite runs them.
json=$(cargo build --release --features cudarc,sm90-bias --tests --examples --benches \
  --message-format=json "$@")
# Copy each test / bench / example executable under its target name, and note where build.rs
# left the C++ library's archives and cudart.
python3 - "$json" <<'PY'
import json, os, shutil, sys
for line in sys.argv[1].splitlines():
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and "/build/flashcore-" in m["out_dir"]:
        libs = [p.split("=", 1)[1] for p in m.get("linked_paths", []) if p.startswith("native=")]
        cudart = next(d for d in libs if os.path.isfile(os.path.join(d, "libcudart_static.a")))
        with open("target/bundle-cpp-link", "w") as f:
            f.write(m["out_dir"] + "\n" + cudart + "\n")
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    kind = t["kind"][0]
    if kind == "test" and t["name"] not in ("gpu", "cudarc", "runtime"):
        continue  # CPU suites run in CI
    if kind == "lib":
        continue  # unit tests of the lib run in CI
    if kind == "bench" and os.environ.get("BUNDLE_CRITERION") != "1":
        continue  # ~15 MB each (the fatbin); the bench CLI example covers the table
    name = {"test": "test-", "bench": "bench-", "example": "example-"}.get(kind, "") + t["name"]
    shutil.copy(m["executable"], "bundle/" + name)
    print("bundled", name)
PY
if [ "${BUNDLE_CMAKE:-0}" = 1 ]; then
  # The C++ example through CMake (the standalone C++ library), SASS for the H200 only; CMake
  # from PyPI where the machine has none (the version CI pins).
  command -v cmake >/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check cmake==4.1.2
  cmake -S examples/cpp -B target/cpp-example-sm90 -DFLASHCORE_CUDA_ARCHS=90 \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build target/cpp-example-sm90 -j "$(nproc)" >/dev/null
  cp target/cpp-example-sm90/flashcore_example bundle/cpp-example
else
  # The C++ example against build.rs's archives: the C++ API's objects (attention.cpp and the
  # core) come from the bridge archive without its Rust glue, which nothing here references.
  { read -r out; read -r cudart; } < target/bundle-cpp-link
  "${CXX:-g++}" -std=c++17 -O2 examples/cpp/main.cpp -Icpp/include -I"$cudart/../include" \
    "$out/libflashcore_bridge.a" "$out/libflashcore_kernels.a" -L"$cudart" -lcudart_static \
    -ldl -lrt -lpthread -o bundle/cpp-example
fi
echo "bundled cpp-example"
cp scripts/run_bundle.sh bundle/run.sh
cp scripts/torch_sdpa.py scripts/merge_bench.py scripts/sanitize.sh scripts/ab_bench.sh \
  scripts/ab_report.py scripts/scoreboard.sh scripts/scoreboard_report.py scripts/limited.sh \
  scripts/torch_sdpa_backward.py bundle/
du -sh bundle
# The device tool carries at most 64 MiB: an xz archive of the bundle (in ignored dist/) fits with
# room to spare. On the GPU host: tar xJf dist/bundle.tar.xz && bash bundle/run.sh OUT_DIR
mkdir -p dist
tar cJf dist/bundle.tar.xz bundle
du -sh dist/bundle.tar.xz
