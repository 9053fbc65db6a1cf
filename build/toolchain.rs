//! Finding (or provisioning) the CUDA toolkit and CUTLASS for build.rs.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Oldest CUDA accepted: CUTLASS 4.x and the sm_90 targets need CUDA 12; 12.4 is the oldest
/// release we know builds example 41 for all four default archs.
const MIN_CUDA: (u32, u32) = (12, 4);

pub struct Cuda {
    pub nvcc: PathBuf,
    pub include: PathBuf,
    pub lib: PathBuf,
    pub version_text: String,
}

fn fail(msg: &str) -> ! {
    panic!(
        "\n\nflashcore: {msg}\n\nSet NVCC (path to nvcc) or CUDA_HOME/CUDA_PATH to a CUDA >= {}.{} \
         toolkit and CUTLASS_DIR to a CUTLASS 4.2.0 checkout, or build with \
         `--no-default-features` for the CPU backend only.\n",
        MIN_CUDA.0, MIN_CUDA.1
    )
}

fn provision(manifest: &Path, third_party: &Path, only: &str) {
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .arg(manifest.join("scripts/fetch_toolchain.py"))
        .arg(manifest.join("third_party/toolchain.lock"))
        .arg(third_party)
        .args(["--only", only])
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "provisioning the pinned {only} wheels failed ({s})"
        )),
        Err(e) => fail(&format!(
            "cannot run {python} to provision the pinned {only} wheels: {e}"
        )),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn nvcc_candidate() -> Option<PathBuf> {
    if let Some(p) = env::var_os("NVCC") {
        return Some(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = env::var_os(var) {
            return Some(PathBuf::from(root).join("bin/nvcc"));
        }
    }
    which("nvcc")
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let rest = &text[text.find("release ")? + "release ".len()..];
    let ver = rest.split(',').next()?;
    let mut it = ver.trim().split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

pub fn find_cuda(manifest: &Path, third_party: &Path) -> Cuda {
    let nvcc = nvcc_candidate().unwrap_or_else(|| {
        let provisioned = third_party.join("cuda/bin/nvcc");
        provision(manifest, third_party, "cuda");
        provisioned
    });
    let out = Command::new(&nvcc)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run {}: {e}", nvcc.display())));
    let version_text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = parse_version(&version_text)
        .unwrap_or_else(|| fail(&format!("cannot read the version of {}", nvcc.display())));
    if version < MIN_CUDA {
        fail(&format!(
            "{} is CUDA {}.{}; flashcore needs >= {}.{}",
            nvcc.display(),
            version.0,
            version.1,
            MIN_CUDA.0,
            MIN_CUDA.1
        ));
    }
    let root = nvcc
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| fail("nvcc is not inside a toolkit's bin/"))
        .to_path_buf();
    let lib = ["lib64", "lib", "targets/x86_64-linux/lib"]
        .iter()
        .map(|d| root.join(d))
        .find(|d| d.join("libcudart_static.a").is_file())
        .unwrap_or_else(|| fail(&format!("no libcudart_static.a under {}", root.display())));
    let include = [
        root.join("include"),
        root.join("targets/x86_64-linux/include"),
    ]
    .into_iter()
    .find(|d| d.join("cuda_runtime_api.h").is_file())
    .unwrap_or_else(|| fail(&format!("no cuda_runtime_api.h under {}", root.display())));
    Cuda {
        nvcc,
        include,
        lib,
        version_text,
    }
}

pub fn find_cutlass(manifest: &Path, third_party: &Path) -> PathBuf {
    let dir = match env::var_os("CUTLASS_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let dir = third_party.join("cutlass");
            provision(manifest, third_party, "cutlass");
            dir
        }
    };
    for needed in [
        "include/cutlass/cutlass.h",
        "examples/41_fused_multi_head_attention/kernel_forward.h",
    ] {
        if !dir.join(needed).is_file() {
            fail(&format!("CUTLASS at {} lacks {needed}", dir.display()));
        }
    }
    dir
}
