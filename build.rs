//! Build script: without the `cuda` feature (or on docs.rs) nothing is compiled. With it:
//! find or provision CUDA and CUTLASS (build/toolchain.rs), compile the kernels named by
//! the tile tables with nvcc, cached by content hash (build/kernels.rs), and the cxx bridge.

#[path = "build/kernels.rs"]
#[allow(dead_code)]
mod kernels;
#[path = "src/plan/tiles.rs"]
#[allow(dead_code)]
mod tiles;
#[path = "build/toolchain.rs"]
mod toolchain;

use std::env;
use std::path::PathBuf;

const DEFAULT_ARCHS: &str = "80;86;89;90";

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
        "src/plan/tiles.rs",
        "scripts/fetch_toolchain.py",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=third_party/toolchain.lock");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() || env::var_os("DOCS_RS").is_some() {
        return;
    }

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
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

    let cpp = manifest.join("cpp");
    let gen = out_dir.join("gen");
    let units = kernels::generate(&gen);

    // The bridge first: GNU ld resolves static archives left to right.
    cxx_build::bridge("src/cuda/ffi.rs")
        .file(cpp.join("src/bridge.cpp"))
        .file(cpp.join("src/sm80/dispatch.cpp"))
        .file(cpp.join("src/wmma/dispatch.cpp"))
        .include(cpp.join("include"))
        .include(cpp.join("src"))
        .include(&gen)
        .include(&cuda.include)
        .std("c++17")
        .compile("flashcore_bridge");

    let config = kernels::Config {
        cuda: &cuda,
        cutlass: &cutlass,
        cpp: &cpp,
        archs: &archs,
        cache: &cache,
        jobs,
        out_dir: &out_dir,
    };
    let objects = config.compile(&units);
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
