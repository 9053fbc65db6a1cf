//! Build script. Always: the cxx bridge and the host-only C++ core (validation, planning, tile
//! tables; plain C++17, no CUDA). With the `cuda` feature: find or provision CUDA and CUTLASS
//! (build/toolchain.rs), compile the kernels of `cpp/src/*/instances/` with nvcc, cached by
//! content hash (build/kernels.rs), and the CUDA half of the bridge. On docs.rs: nothing.

#[path = "build/kernels.rs"]
#[allow(dead_code)]
mod kernels;
#[path = "build/toolchain.rs"]
mod toolchain;

use std::env;
use std::path::PathBuf;

/// SASS targets by default. Compute capability 8.6 (and 8.7) runs the sm_80 SASS: a cubin runs on
/// any later minor version of its major one, and the kernels have no arch-specific code; building
/// sm_86 as well would cost about a quarter of the non-Hopper kernels' compile time (about 23 s
/// of a clean build on 2 cores). Example 41 builds 8.x as sm_80 alone (build/kernels.rs).
const DEFAULT_ARCHS: &str = "80;89;90";

fn main() {
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUTLASS_DIR",
        "FLASHCORE_CUDA_ARCHS",
        "FLASHCORE_NVCC_JOBS",
        "FLASHCORE_CACHE_DIR",
        "FLASHCORE_THIRD_PARTY_DIR",
        "DOCS_RS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for path in [
        "build",
        "build.rs",
        "cpp",
        "src/ffi/mod.rs",
        "scripts/fetch_toolchain.py",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=third_party/toolchain.lock");
    if env::var_os("DOCS_RS").is_some() {
        return;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let cpp = manifest.join("cpp");
    let core_sources = [
        "src/bridge_core.cpp",
        "src/core/checks.cpp",
        "src/core/validate.cpp",
        "src/core/merge.cpp",
        "src/core/backward.cpp",
        "src/core/varlen.cpp",
        "src/core/paged.cpp",
        "src/core/alibi.cpp",
        "src/core/bias.cpp",
        "src/core/plan.cpp",
        "src/core/splits.cpp",
        "src/core/tables.cpp",
        "src/core/status.cpp",
    ];
    let mut bridge = cxx_build::bridge("src/ffi/mod.rs");
    bridge
        .files(core_sources.map(|f| cpp.join(f)))
        .include(cpp.join("include"))
        .include(cpp.join("src"))
        .std("c++17");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        bridge.compile("flashcore_bridge");
        return;
    }

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let third_party = env::var_os("FLASHCORE_THIRD_PARTY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("third_party"));
    let cuda = toolchain::find_cuda(&manifest, &third_party);
    let cutlass = toolchain::find_cutlass(&manifest, &third_party);

    let archs: Vec<String> = env::var("FLASHCORE_CUDA_ARCHS")
        .unwrap_or_else(|_| DEFAULT_ARCHS.into())
        .split([';', ','])
        .map(|s| s.trim().trim_start_matches("sm_").to_string())
        .filter(|s| !s.is_empty())
        .collect();
    // OUT_DIR is <target>/<profile>/build/<pkg>/out: share one cache across profiles.
    let cache = env::var_os("FLASHCORE_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            out_dir
                .ancestors()
                .nth(4)
                .unwrap()
                .join("flashcore-nvcc-cache")
        });
    let jobs = env::var("FLASHCORE_NVCC_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
        .max(1);

    if kernels::builds_hopper(&archs) {
        bridge.define("FLASHCORE_WITH_SM90", "1");
    }
    for define in kernels::optional_defines(&archs) {
        bridge.define(define, "1");
    }
    bridge
        .file(cpp.join("src/bridge.cpp"))
        .file(cpp.join("src/attention.cpp"))
        .file(cpp.join("src/planned.cpp"))
        .file(cpp.join("src/merge.cpp"))
        .file(cpp.join("src/backward.cpp"))
        .file(cpp.join("src/dispatch.cpp"))
        .include(&cuda.include);

    // cc takes nvcc from $NVCC in CUDA mode (an explicit .compiler() loses nvcc's flag
    // translation). Set before any thread starts.
    env::set_var("NVCC", &cuda.nvcc);
    let config = kernels::Config {
        cuda: &cuda,
        cutlass: &cutlass,
        cpp: &cpp,
        archs: &archs,
        cache: &cache,
        jobs,
        out_dir: &out_dir,
    };
    // The bridge's host C++ (one g++ at a time, about 20 s) compiles beside the kernels instead
    // of before them. Its archive is still announced first: GNU ld resolves static archives left
    // to right, and the kernels' archive is made after the join.
    let objects = std::thread::scope(|s| {
        let host = s.spawn(|| bridge.compile("flashcore_bridge"));
        let objects = config.compile(&kernels::units(&cpp, &archs));
        if let Err(panic) = host.join() {
            std::panic::resume_unwind(panic);
        }
        objects
    });
    cc::Build::new()
        .objects(&objects)
        .cargo_metadata(true)
        .compile("flashcore_kernels");

    println!("cargo:rustc-link-search=native={}", cuda.lib.display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    for lib in ["dl", "rt", "pthread", "stdc++"] {
        println!("cargo:rustc-link-lib={lib}");
    }
}
