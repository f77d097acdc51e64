//! Builds `kernel-crate` to PTX with rustc's own `nvptx64-nvidia-cuda` target,
//! once per target family, and leaves the PTX in `OUT_DIR` for `include_str!`.
//!
//! Needs nothing but the pinned nightly and its `rust-src` component
//! (`-Zbuild-std=core`): no nvcc, no CUDA toolkit, no LLVM beyond rustc's.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// (arch, PTX ISA feature). sm_80 is the portable build (Ampere and later,
/// PTX ISA 7.1 = CUDA 11.1 drivers); sm_90 is the Hopper build (ISA 8.0);
/// sm_90a adds the Hopper-native kernels (`kernel-crate/src/hopper`, compiled
/// only with `--cfg fa_sm90a`: wgmma and setmaxnreg exist on sm_90a alone).
/// Never emit an ISA newer than the oldest driver we support JIT-compiles.
const ARCHS: &[(&str, &str)] = &[("sm_80", "+ptx71"), ("sm_90", "+ptx80"), ("sm_90a", "+ptx80")];

/// Entry-name prefixes of the warp-specialized Hopper kernels and the
/// directives their entries get: `setmaxnreg` is ignored (ptxas C7508)
/// unless the kernel has a register cap at entry, which `.maxntid` with
/// `.minnctapersm 1` gives (rustc has no launch-bounds attribute).
/// Threads: 128 per warpgroup, the producer and 2 consumers, or 3 consumers
/// for the kernels named `*_w3*`.
const HOPPER_ENTRY_PREFIX: &str = ".entry flash_fwd_hopper_";
const HOPPER_ENTRY_DIRECTIVES: &str = ".maxntid 384, 1, 1\n.minnctapersm 1";
const HOPPER_ENTRY_DIRECTIVES_W3: &str = ".maxntid 512, 1, 1\n.minnctapersm 1";

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernel_dir = manifest.parent().unwrap().join("kernel-crate");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    for p in ["src", "common/src", "Cargo.toml", "common/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", kernel_dir.join(p).display());
    }

    let (cargo, rustc) = kernel_toolchain();
    check_rust_src(&rustc);

    let children: Vec<_> = ARCHS
        .iter()
        .map(|&(arch, ptx)| {
            let target_dir = out_dir.join(format!("kernels-{arch}"));
            let mut cmd = Command::new(&cargo);
            clean_env(&mut cmd);
            // `fa_ptx74`: instructions of PTX ISA ≥ 7.4 (the L2 prefetch
            // hints of `cp.async`), absent from the ISA 7.1 portable build.
            let extra: &[&str] = match arch {
                "sm_90a" => &["--cfg", "fa_sm90a", "--cfg", "fa_ptx74"],
                "sm_90" => &["--cfg", "fa_ptx74"],
                _ => &[],
            };
            cmd.current_dir(&kernel_dir)
                .env("RUSTC", &rustc)
                .env("RUSTUP_TOOLCHAIN", KERNEL_TOOLCHAIN)
                .env(
                    "CARGO_ENCODED_RUSTFLAGS",
                    [
                        &format!("-Ctarget-cpu={arch}"),
                        &format!("-Ctarget-feature={ptx}"),
                        "-Clinker=/bin/true",
                        // The tensor-core kernels keep their fragments in
                        // register arrays indexed by loop counters: every such
                        // loop must be fully unrolled, or the arrays go to local
                        // memory (a stack frame in `ptxas -v`). LLVM's default
                        // threshold stops short on the d = 128 nests.
                        "-Cllvm-args=-unroll-threshold=5000",
                        "-Awarnings",
                    ]
                    .iter()
                    .chain(extra)
                    .copied()
                    .collect::<Vec<&str>>()
                    .join("\x1f"),
                )
                .args(["rustc", "--quiet", "--release", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
                .arg("--target-dir")
                .arg(&target_dir)
                .args(["--", "--emit=asm"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child =
                cmd.spawn().unwrap_or_else(|e| panic!("cannot run `{}` to build the kernels: {e}", cargo.display()));
            (arch, target_dir, child)
        })
        .collect();

    for (arch, target_dir, child) in children {
        let out = child.wait_with_output().expect("waiting for the kernel build");
        if !out.status.success() {
            panic!(
                "building kernel-crate for nvptx64-nvidia-cuda ({arch}) failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let asm = target_dir.join("nvptx64-nvidia-cuda/release/deps/flash_attn_kernels.s");
        let dst = out_dir.join(format!("flash_attn_{arch}.ptx"));
        let ptx = std::fs::read_to_string(&asm).unwrap_or_else(|e| panic!("read {}: {e}", asm.display()));
        let ptx = if arch == "sm_90a" { add_hopper_entry_directives(&ptx) } else { ptx };
        std::fs::write(&dst, ptx).unwrap_or_else(|e| panic!("write {}: {e}", dst.display()));
    }
}

/// Inserts [`HOPPER_ENTRY_DIRECTIVES`] after the parameter list of every
/// entry named `flash_fwd_hopper_*` (between its closing `)` and `{`).
fn add_hopper_entry_directives(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len() + 4096);
    let mut in_hopper_params = false;
    let mut w3 = false;
    let mut edited = 0;
    for line in ptx.lines() {
        if line.contains(HOPPER_ENTRY_PREFIX) {
            in_hopper_params = true;
            w3 = line.contains("_w3");
        }
        // Tensor-map parameters (128 bytes, `#[repr(align(16))]` in Rust:
        // rustc rejects a by-value kernel parameter aligned to more than 16)
        // get the 64-byte alignment TMA needs, as nvcc declares a
        // `__grid_constant__ CUtensorMap`. Their offsets (0, 128, 256) are
        // multiples of 64 either way, so the layout is unchanged.
        if line.contains("hopper") && line.contains(".param .align 16 .b8 ") && line.trim_end_matches(',').ends_with("[128]") {
            out.push_str(&line.replacen(".align 16", ".align 64", 1));
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if in_hopper_params && line.trim() == ")" {
            out.push_str(if w3 { HOPPER_ENTRY_DIRECTIVES_W3 } else { HOPPER_ENTRY_DIRECTIVES });
            out.push('\n');
            in_hopper_params = false;
            edited += 1;
        }
    }
    assert!(edited > 0, "sm_90a PTX: no flash_fwd_hopper_* entry found to add .maxntid to");
    out
}

/// The toolchain the kernels are built with, whatever toolchain builds the
/// crate that depends on us (stable, another nightly): the pinned nightly
/// of the repository's `rust-toolchain.toml`. Kept here too, because a
/// packaged copy of this crate has no `rust-toolchain.toml` beside it;
/// `cargo xtask test` checks that the two agree.
const KERNEL_TOOLCHAIN: &str = "nightly-2026-05-20";

/// `(cargo, rustc)` of [`KERNEL_TOOLCHAIN`], found through rustup; without
/// rustup, the outer build's own cargo/rustc if they are that nightly
/// (e.g. a distribution's build of it). Panics with the one command that
/// installs what is missing.
fn kernel_toolchain() -> (PathBuf, PathBuf) {
    let install = format!("rustup toolchain install {KERNEL_TOOLCHAIN} --profile minimal --component rust-src");
    let which = |tool: &str| -> Option<PathBuf> {
        let out = Command::new("rustup")
            .args(["which", "--toolchain", KERNEL_TOOLCHAIN, tool])
            .env_remove("RUSTUP_TOOLCHAIN")
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    };
    let rustup_present = Command::new("rustup").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if rustup_present {
        match (which("cargo"), which("rustc")) {
            (Some(cargo), Some(rustc)) if cargo.exists() && rustc.exists() => return (cargo, rustc),
            _ => panic!(
                "\n\nflash-attn compiles its GPU kernels with the Rust toolchain {KERNEL_TOOLCHAIN} (whatever \
                 toolchain builds your crate), and rustup does not have it.\nRun:\n\n    {install}\n\n"
            ),
        }
    }
    // No rustup: the outer toolchain, if it is the pinned nightly.
    let rustc = PathBuf::from(env::var("RUSTC").unwrap_or_else(|_| "rustc".into()));
    let cargo = PathBuf::from(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    let version = Command::new(&rustc).arg("-V").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    match version {
        Some(v) if v.contains("nightly") => {
            // Its version line names a commit date, not the nightly's name:
            // say which compiler built the kernels, as it may not be ours.
            println!("cargo:warning=flash-attn: rustup not found; building the kernels with `{}` (pinned: {KERNEL_TOOLCHAIN})", v.trim());
            (cargo, rustc)
        }
        v => panic!(
            "\n\nflash-attn compiles its GPU kernels with the Rust toolchain {KERNEL_TOOLCHAIN}, found through \
             rustup, and rustup is not installed (the outer rustc is {}).\nInstall rustup (https://rustup.rs), then run:\n\n    {install}\n\n",
            v.as_deref().map(str::trim).unwrap_or("unknown")
        ),
    }
}

/// `-Zbuild-std=core` compiles core from the toolchain's `rust-src`; say
/// exactly how to get it when it is missing.
fn check_rust_src(rustc: &Path) {
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let Some(sysroot) = sysroot else {
        panic!("cannot run `{} --print sysroot`", rustc.display());
    };
    let core = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !Path::new(&core).exists() {
        panic!(
            "\n\nflash-attn builds its GPU kernels with `-Zbuild-std=core`, which needs the `rust-src` \
             component of {KERNEL_TOOLCHAIN}, and it is missing ({} not found).\nRun:\n\n    \
             rustup component add rust-src --toolchain {KERNEL_TOOLCHAIN}\n\n",
            core.display()
        );
    }
}

/// The nested cargo must not inherit the outer build's flags, target or
/// wrappers (they are for the host target).
fn clean_env(cmd: &mut Command) {
    for (k, _) in env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        let keep = matches!(k, "CARGO_HOME" | "CARGO_MAKEFLAGS" | "CARGO_NET_OFFLINE" | "CARGO_REGISTRIES_CRATES_IO_PROTOCOL");
        if !keep && (k.starts_with("CARGO_") || k.starts_with("__CARGO") || k.starts_with("RUSTC") || k == "RUSTFLAGS" || k == "RUSTDOCFLAGS")
        {
            cmd.env_remove(k);
        }
    }
}
