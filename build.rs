//! Embeds the kernel image that `src/kernel.rs` loads with `cuModuleLoadData`.
//!
//! In order of preference:
//! 1. `SIMPLE_IPC_KERNEL_IMAGE`: a file made elsewhere (CMakeLists.txt passes the fatbin it built);
//! 2. a fatbin compiled here from `kernels/simple_kernel.cu`, when an nvcc is found (`NVCC`, `PATH`,
//!    `CUDA_PATH`, `/usr/local/cuda`); `NVCC=none` skips this step;
//! 3. the PTX committed beside the source (`kernels/simple_kernel.ptx`, made by `scripts/regenerate-ptx.sh`),
//!    so that machines without CUDA, such as CI, build the same program.
//!
//! The image lands in `OUT_DIR/simple_kernel.image`; `SIMPLE_IPC_KERNEL_FORMAT` tells the crate what it is,
//! and `SIMPLE_IPC_KERNEL_NEEDS` what it needs of the driver, for `--version`.
//!
//! `SIMPLE_IPC_REVISION` is the git revision the program is built from, for `--version`: `git rev-parse
//! --short HEAD` of this package's own repository, with `-dirty` where a tracked file differs from it;
//! `unknown` where there is no git or no repository (a source tarball); the variable of that name, where the
//! build is given one (an image built from a tree without `.git`). Nothing here fails the build.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The architectures of the sample's CMakeLists.txt; the last one also gets PTX, for GPUs newer than the list.
const ARCHITECTURES: [u32; 9] = [75, 80, 86, 87, 89, 90, 100, 110, 120];

fn main() {
    println!("cargo:rerun-if-changed=kernels/simple_kernel.cu");
    println!("cargo:rerun-if-changed=kernels/simple_kernel.ptx");
    println!("cargo:rerun-if-env-changed=SIMPLE_IPC_KERNEL_IMAGE");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"));
    let image = out_dir.join("simple_kernel.image");

    let format = if let Some(given) = env::var_os("SIMPLE_IPC_KERNEL_IMAGE") {
        println!("cargo:rerun-if-changed={}", Path::new(&given).display());
        fs::copy(&given, &image)
            .unwrap_or_else(|e| panic!("SIMPLE_IPC_KERNEL_IMAGE={}: {e}", Path::new(&given).display()));
        "fatbin"
    } else if let Some(nvcc) = find_nvcc() {
        if compile_fatbin(&nvcc, &image) {
            "fatbin"
        } else {
            println!("cargo:warning=nvcc ({}) failed; embedding the committed PTX", nvcc.display());
            embed_committed_ptx(&image)
        }
    } else {
        embed_committed_ptx(&image)
    };
    println!("cargo:rustc-env=SIMPLE_IPC_KERNEL_FORMAT={format}");
    let needs = match format {
        "ptx" => "kernel needs CUDA 13.0 / driver 580+ for the embedded PTX".to_owned(),
        _ if env::var_os("SIMPLE_IPC_KERNEL_IMAGE").is_some() => {
            "kernel: the image given at build time (SIMPLE_IPC_KERNEL_IMAGE)".to_owned()
        }
        _ => format!(
            "kernel: machine code for sm_{} to sm_{}, built by nvcc",
            ARCHITECTURES[0],
            ARCHITECTURES[ARCHITECTURES.len() - 1]
        ),
    };
    println!("cargo:rustc-env=SIMPLE_IPC_KERNEL_NEEDS={needs}");
    println!("cargo:rustc-env=SIMPLE_IPC_REVISION={}", revision());
}

/// The git revision of this package's tree (see the module's doc); never fails.
fn revision() -> String {
    println!("cargo:rerun-if-env-changed=SIMPLE_IPC_REVISION");
    if let Some(given) = env::var("SIMPLE_IPC_REVISION").ok().filter(|r| !r.trim().is_empty()) {
        return given.trim().to_owned();
    }
    let root = env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_default();
    // GIT_OPTIONAL_LOCKS=0: `git status` would otherwise refresh the stat data of the index and write
    // .git/index, which this script watches (below), so that the build after a fresh clone would find the index
    // changed and build the crate again for nothing. A git older than 2.15 ignores the variable, where the
    // option `--no-optional-locks` would fail every command.
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&root)
            .env("GIT_OPTIONAL_LOCKS", "0")
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_owned())
    };
    // Only this package's own repository: a source tarball unpacked inside another repository is not it.
    let top = git(&["rev-parse", "--show-toplevel"]).map(PathBuf::from);
    let ours = match (top.and_then(|t| t.canonicalize().ok()), root.canonicalize().ok()) {
        (Some(top), Some(root)) => top == root,
        _ => false,
    };
    let Some(rev) = git(&["rev-parse", "--short", "HEAD"]).filter(|r| ours && !r.is_empty()) else {
        return "unknown".to_owned();
    };
    // Built again when HEAD moves, the index changes or what is built changes, so that `-dirty` holds. Only
    // paths that exist are watched: cargo counts a missing one as changed, and would run this script and build
    // the crate again on every build (a repository may have no packed-refs, nor reftable). A branch whose ref
    // is only in packed-refs has no file of its own: its directory is watched instead, since a commit writes
    // the file there.
    let git_path = |path: &str| git(&["rev-parse", "--git-path", path]).map(|file| root.join(file));
    let mut watched: Vec<PathBuf> =
        ["HEAD", "index", "packed-refs", "reftable"].into_iter().filter_map(git_path).collect();
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"])
        && let (Some(file), Some(refs)) = (git_path(&reference), git_path("refs"))
    {
        // Never above refs/: the git directory itself would be scanned whole, objects and all.
        watched.extend(
            file.ancestors().take_while(|p| p.starts_with(&refs)).find(|p| p.exists()).map(Path::to_path_buf),
        );
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    for built in ["src", "build.rs", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={built}");
    }
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if !changes.is_empty() => format!("{rev}-dirty"),
        _ => rev,
    }
}

fn find_nvcc() -> Option<PathBuf> {
    match env::var_os("NVCC") {
        Some(v) if v == "none" || v.is_empty() => return None,
        Some(v) => return Some(PathBuf::from(v)),
        None => {}
    }
    let on_path = env::var_os("PATH")
        .into_iter()
        .flat_map(|p| env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("nvcc"));
    let known = env::var_os("CUDA_PATH")
        .map(|p| PathBuf::from(p).join("bin/nvcc"))
        .into_iter()
        .chain([PathBuf::from("/usr/local/cuda/bin/nvcc")]);
    on_path.chain(known).find(|p| p.is_file())
}

fn compile_fatbin(nvcc: &Path, image: &Path) -> bool {
    let mut cmd = Command::new(nvcc);
    cmd.args(["-fatbin", "-lineinfo", "-o"]).arg(image);
    for arch in ARCHITECTURES {
        cmd.arg(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    }
    let newest = ARCHITECTURES[ARCHITECTURES.len() - 1];
    cmd.arg(format!("-gencode=arch=compute_{newest},code=compute_{newest}"));
    cmd.arg("kernels/simple_kernel.cu");
    matches!(cmd.status(), Ok(s) if s.success())
}

/// PTX is text that `cuModuleLoadData` reads up to a NUL, so the copy gets one.
fn embed_committed_ptx(image: &Path) -> &'static str {
    let mut ptx = fs::read("kernels/simple_kernel.ptx").expect("kernels/simple_kernel.ptx is committed");
    ptx.push(0);
    fs::write(image, ptx).expect("OUT_DIR is writable");
    "ptx"
}
