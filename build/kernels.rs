//! Compiling the kernel translation units for build.rs: the files of `cpp/src/*/instances/` (one
//! Hopper kernel per TU; one TU per dtype for the cheaper families, whose kernels cost less to
//! compile than the headers they parse), compiled by nvcc through `cc`, cached by content hash.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::toolchain::Cuda;

/// A kernel family (or the merge kernel): the folder under `cpp/src/` whose `instances/` holds
/// its translation units, and how nvcc builds them. One row per family: adding a family is adding a row.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Family {
    dir: &'static str,
    /// The CUTLASS example folder its kernels include (and whose files key the cache).
    cutlass_example: Option<&'static str>,
    /// Hopper-only (SASS `sm_90a`): built only when 90 is among the target archs.
    hopper: bool,
    /// Its SASS for compute capability 8.x is built once, as sm_80, which 8.6 and 8.9 run (a
    /// cubin runs on later minor versions of its major one): saves a third of its compile time.
    ampere_as_sm80: bool,
    /// Our own kernel must not spill at any tile of its table: make a spill a build error.
    no_spills: bool,
    /// Kernels in a subfolder of `instances/` that only a cargo feature builds.
    optional: Option<Optional>,
}

/// A family's kernels that a build may go without (they cost minutes of a clean build): the
/// files of `instances/<dir>/`, built when cargo feature `feature` is on, which then defines
/// `define` for the bridge (dispatch.cpp calls them only then).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Optional {
    dir: &'static str,
    feature: &'static str,
    define: &'static str,
}

impl Optional {
    /// Whether cargo builds this crate with the feature.
    fn enabled(self) -> bool {
        let var = format!(
            "CARGO_FEATURE_{}",
            self.feature.to_uppercase().replace('-', "_")
        );
        std::env::var_os(var).is_some()
    }
}

pub const FAMILIES: [Family; 6] = [
    // CUTLASS example 41.
    Family {
        dir: "sm80",
        cutlass_example: Some("examples/41_fused_multi_head_attention"),
        hopper: false,
        ampere_as_sm80: true,
        no_spills: false,
        optional: None,
    },
    // flashcore's WMMA kernel.
    Family {
        dir: "wmma",
        cutlass_example: None,
        hopper: false,
        ampere_as_sm80: false,
        no_spills: true,
        optional: None,
    },
    // CUTLASS example 88's Hopper mainloop under flashcore's kernel layer.
    Family {
        dir: "sm90",
        cutlass_example: Some("examples/88_hopper_fmha"),
        hopper: true,
        ampere_as_sm80: false,
        no_spills: false,
        // The bias schedules (docs/HOPPER.md, round 43): six kernels.
        optional: Some(Optional {
            dir: "bias",
            feature: "sm90-bias",
            define: "FLASHCORE_WITH_SM90_BIAS",
        }),
    },
    // flashcore's merge of attention states (not an attention kernel: no tile table).
    Family {
        dir: "merge",
        cutlass_example: None,
        hopper: false,
        ampere_as_sm80: false,
        no_spills: true,
        optional: None,
    },
    // flashcore's backward pass (WMMA tensor cores; no tile table).
    Family {
        dir: "backward",
        cutlass_example: None,
        hopper: false,
        ampere_as_sm80: true,
        no_spills: false,
        optional: None,
    },
    // flashcore's Hopper backward kernel (wgmma and TMA through CuTe; example 88's helpers).
    Family {
        dir: "backward/sm90",
        cutlass_example: Some("examples/88_hopper_fmha"),
        hopper: true,
        ampere_as_sm80: false,
        no_spills: false,
        optional: None,
    },
];

/// Whether `archs` (as in FLASHCORE_CUDA_ARCHS) includes Hopper, so the sm90 family is built.
pub fn builds_hopper(archs: &[String]) -> bool {
    archs.iter().any(|a| a == "90" || a == "90a")
}

/// Whether `family` is built for `archs`.
fn built(family: Family, archs: &[String]) -> bool {
    !family.hopper || builds_hopper(archs)
}

/// The bridge's defines for the optional kernels this build compiles (see [`Optional`]).
pub fn optional_defines(archs: &[String]) -> Vec<&'static str> {
    FAMILIES
        .iter()
        .filter(|f| built(**f, archs))
        .filter_map(|f| f.optional)
        .filter(|o| o.enabled())
        .map(|o| o.define)
        .collect()
}

/// The archs `family` gets SASS for among the target `archs` (in order, without repeats).
fn family_archs(family: Family, archs: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for arch in archs {
        let arch = if family.ampere_as_sm80 && arch.starts_with('8') {
            "80".to_string()
        } else {
            arch.clone()
        };
        if !out.contains(&arch) {
            out.push(arch);
        }
    }
    out
}

/// The `-gencode` flags of a non-Hopper family with SASS for `archs`: each arch's SASS, and the
/// PTX of the newest, which the driver compiles when it loads the kernels on a GPU newer than
/// every SASS (compute capability 10.0 and 12.0, Blackwell, with a build for 8.x and 9.0). The PTX
/// is the newest SASS's own compile's, so it costs no compile time, only fatbin bytes. An
/// arch-specific target (`90a`) runs on its own compute capability only: its PTX is the portable
/// `compute_90`, a compile of its own.
fn gencodes(archs: &[String]) -> Vec<String> {
    let number = |a: &String| a.trim_end_matches('a').parse::<u32>().unwrap_or(0);
    let newest = archs.iter().max_by_key(|a| number(a));
    let mut flags = Vec::new();
    for arch in archs {
        let portable = Some(arch) == newest && !arch.ends_with('a');
        flags.push(if portable {
            format!("-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]")
        } else {
            format!("-gencode=arch=compute_{arch},code=sm_{arch}")
        });
    }
    if let Some(arch) = newest.filter(|a| a.ends_with('a')) {
        let arch = arch.trim_end_matches('a');
        flags.push(format!("-gencode=arch=compute_{arch},code=compute_{arch}"));
    }
    flags
}

pub struct Unit {
    name: String,
    source: PathBuf,
    family: Family,
}

/// Every kernel translation unit of the families built for `archs`:
/// `cpp/src/<family>/instances/*.cu` (for the Hopper family one per dtype x tile x role of its
/// `instances.inc`, for the others one per dtype, each instantiating every row), and
/// those of its optional subfolder where its feature is on.
pub fn units(cpp: &Path, archs: &[String]) -> Vec<Unit> {
    let mut units = Vec::new();
    for family in FAMILIES {
        if !built(family, archs) {
            continue;
        }
        let dir = cpp.join("src").join(family.dir).join("instances");
        let mut sources = files_with_extension(&dir, "cu");
        if let Some(optional) = family.optional.filter(|o| o.enabled()) {
            sources.extend(files_with_extension(&dir.join(optional.dir), "cu"));
        }
        for source in sources {
            let stem = source.file_stem().unwrap().to_string_lossy();
            units.push(Unit {
                name: format!("fmha_{}_{stem}", family.dir.replace('/', "_")),
                source,
                family,
            });
        }
    }
    units
}

/// The files of `dir` (not its subfolders) named `*.ext`, sorted.
fn files_with_extension(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

/// Every file under `cpp` that `source` (whose contents are `source_bytes`) includes with
/// `#include "..."`, directly or through another such file: its path relative to `cpp` and its
/// contents (each read once), sorted by path. Names found elsewhere (CUTLASS's) are left to the
/// family hash.
fn local_includes(source: &Path, source_bytes: &[u8], cpp: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let cpp = cpp.canonicalize().expect("cpp/ exists");
    let roots = [cpp.join("include"), cpp.join("src")];
    let mut found = std::collections::BTreeMap::new();
    let mut pending = included_files(source, source_bytes, &roots);
    while let Some(path) = pending.pop() {
        if path.starts_with(&cpp) && !found.contains_key(&path) {
            let contents = fs::read(&path).expect("read a kernel header");
            pending.extend(included_files(&path, &contents, &roots));
            found.insert(path, contents);
        }
    }
    let relative =
        |(p, bytes): (PathBuf, Vec<u8>)| (p.strip_prefix(&cpp).unwrap_or(&p).to_path_buf(), bytes);
    found.into_iter().map(relative).collect()
}

/// The files that `file` (whose contents are `bytes`) names with `#include "..."`, canonical. A
/// name resolves against the including file's folder, then `roots` (`cpp/include` and
/// `cpp/src`), as nvcc's `-I` flags do; a name found nowhere is skipped.
fn included_files(file: &Path, bytes: &[u8], roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in String::from_utf8_lossy(bytes).lines() {
        let Some(rest) = line.trim_start().strip_prefix("#include") else {
            continue;
        };
        let Some(name) = rest
            .trim()
            .strip_prefix('"')
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let here = file.parent().map(|d| d.join(name));
        let candidates = here.into_iter().chain(roots.iter().map(|r| r.join(name)));
        if let Some(path) = candidates
            .filter(|p| p.is_file())
            .find_map(|p| p.canonicalize().ok())
        {
            files.push(path);
        }
    }
    files
}

/// Hash of every file under `dir` (sorted), for the cache key.
fn hash_tree(hasher: &mut Sha256, dir: &Path) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            hash_tree(hasher, &path);
        } else if let Ok(bytes) = fs::read(&path) {
            hasher.update(path.file_name().unwrap().to_string_lossy().as_bytes());
            hasher.update(&bytes);
        }
    }
}

pub struct Config<'a> {
    pub cuda: &'a Cuda,
    pub cutlass: &'a Path,
    pub cpp: &'a Path,
    pub archs: &'a [String],
    pub cache: &'a Path,
    pub jobs: usize,
    pub out_dir: &'a Path,
}

impl Config<'_> {
    fn build(&self, family: Family) -> cc::Build {
        let mut b = cc::Build::new();
        b.cuda(true)
            .cargo_metadata(false)
            .opt_level(3)
            .debug(false)
            .warnings(false)
            .include(self.cpp.join("include"))
            .include(self.cpp.join("src"))
            .include(self.cutlass.join("include"))
            .include(self.cutlass.join("tools/util/include"))
            .flag("-std=c++17")
            .flag("--expt-relaxed-constexpr")
            .flag("-DNDEBUG")
            .flag("-Xcudafe=--diag_suppress=esa_on_defaulted_function_ignored");
        if let Some(example) = family.cutlass_example {
            b.include(self.cutlass.join(example));
        }
        if family.hopper {
            // wgmma and setmaxnreg need the arch-specific target.
            b.flag("-gencode=arch=compute_90a,code=sm_90a");
        } else {
            for flag in gencodes(&family_archs(family, self.archs)) {
                b.flag(flag);
            }
        }
        if family.no_spills {
            b.flag("-Xptxas=-warn-spills,-Werror");
        }
        b
    }

    /// The hash over everything that determines a unit's object: its family's hash, its source
    /// and every header of cpp/ that it includes, directly or not ([`local_includes`]).
    fn key(&self, unit: &Unit, family: &Sha256) -> String {
        let mut h = family.clone();
        let source = fs::read(&unit.source).expect("read a kernel source");
        h.update(&source);
        for (name, contents) in local_includes(&unit.source, &source, self.cpp) {
            h.update(name.to_string_lossy().as_bytes());
            h.update(contents);
        }
        format!("{:x}", h.finalize())
    }

    /// The hash over what every TU of `family` depends on beyond cpp/'s headers: the compiler,
    /// its flags and, for a CUTLASS family, CUTLASS's version and the example's folder.
    fn family_hash(&self, family: Family) -> Sha256 {
        let mut h = Sha256::new();
        h.update(self.cuda.version_text.as_bytes());
        let compiler = self.build(family).get_compiler();
        h.update(format!("{:?}", compiler.args()).as_bytes());
        h.update(compiler.path().to_string_lossy().as_bytes());
        if let Some(example) = family.cutlass_example {
            h.update(fs::read(self.cutlass.join("include/cutlass/version.h")).unwrap_or_default());
            hash_tree(&mut h, &self.cutlass.join(example));
        }
        h
    }

    /// Compiles every unit missing from the cache (at most `jobs` nvcc at once) and returns the
    /// cached object paths in unit order. The caller has set `$NVCC` (build.rs says why).
    pub fn compile(&self, units: &[Unit]) -> Vec<PathBuf> {
        fs::create_dir_all(self.cache).expect("create nvcc cache dir");
        let families = FAMILIES.map(|f| self.family_hash(f));
        let objects: Vec<PathBuf> = units
            .iter()
            .map(|u| {
                let family = &families[FAMILIES.iter().position(|&f| f == u.family).unwrap()];
                let key = self.key(u, family);
                self.cache.join(format!("{}-{}.o", u.name, &key[..16]))
            })
            .collect();
        // Longest first: the Hopper units (about a minute each), then the others (a dtype's
        // tiles of a cheaper family, about as long, and the merge kernel), which fill the tail
        // where one job would otherwise run alone.
        let mut todo: Vec<usize> = (0..units.len())
            .filter(|&i| !objects[i].is_file())
            .collect();
        todo.sort_by_key(|&i| !units[i].family.hopper);
        if !todo.is_empty() {
            println!(
            "cargo:warning=flashcore: {} of {} CUDA kernel objects cached; compiling {} with {} job(s)",
            units.len() - todo.len(),
            units.len(),
            todo.len(),
            self.jobs
        );
        }
        let next = AtomicUsize::new(0);
        let failures = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..self.jobs.min(todo.len()) {
                s.spawn(|| {
                    while let Some(&i) = todo.get(next.fetch_add(1, Ordering::SeqCst)) {
                        if let Err(e) = self.compile_one(&units[i], &objects[i]) {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{}: {e}", units[i].name));
                        }
                    }
                });
            }
        });
        let failures = failures.into_inner().unwrap();
        if !failures.is_empty() {
            panic!("flashcore: nvcc failed:\n{}", failures.join("\n"));
        }
        objects
    }

    fn compile_one(&self, unit: &Unit, cached: &Path) -> Result<(), cc::Error> {
        let scratch = self.out_dir.join("nvcc").join(&unit.name);
        fs::create_dir_all(&scratch).expect("create nvcc scratch dir");
        let objs = self
            .build(unit.family)
            .out_dir(&scratch)
            .file(&unit.source)
            .try_compile_intermediates()?;
        // Publish atomically: a concurrent build sees the whole object or none.
        let tmp = cached.with_extension(format!("o.tmp{}", std::process::id()));
        fs::copy(&objs[0], &tmp).expect("copy object into cache");
        fs::rename(&tmp, cached).expect("publish cached object");
        Ok(())
    }
}
