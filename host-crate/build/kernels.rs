//! How the kernel crate becomes PTX: the target families, the flags, the
//! profile and the post-processing. Everything in this file determines the
//! PTX bytes, so its text is one of the inputs hashed into
//! `host-crate/ptx/manifest.txt` ([`super::inputs`]); the rest of the build
//! script (when to build, where the files go) is not.
//!
//! Shared with `cargo xtask ship-ptx` / `cargo xtask test`, which build the
//! same PTX outside any cargo build script.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::toolchain::Toolchain;

/// (arch, PTX ISA feature). sm_80 is the portable build (Ampere and later,
/// PTX ISA 7.1 = CUDA 11.1 drivers); sm_90 is the Hopper build (ISA 8.0);
/// sm_90a adds the Hopper-native kernels (`kernel-crate/src/hopper`, compiled
/// only with `--cfg fa_sm90a`: wgmma and setmaxnreg exist on sm_90a alone).
/// Never emit an ISA newer than the oldest driver we support JIT-compiles.
pub const ARCHS: &[(&str, &str)] = &[("sm_80", "+ptx71"), ("sm_90", "+ptx80"), ("sm_90a", "+ptx80")];

/// The kernels' profile, given to the nested cargo as `CARGO_PROFILE_RELEASE_*`
/// (the kernel crate is a member of the repository's workspace, whose
/// `[profile.release]` is the host's; a registry copy has no profile at all).
const PROFILE: &[(&str, &str)] = &[
    ("OPT_LEVEL", "3"),
    ("LTO", "fat"),
    ("CODEGEN_UNITS", "1"),
    ("PANIC", "abort"),
    ("DEBUG", "false"),
    ("DEBUG_ASSERTIONS", "false"),
    ("OVERFLOW_CHECKS", "false"),
    ("INCREMENTAL", "false"),
];

/// Entry-name prefixes of the warp-specialized Hopper kernels and the
/// directives their entries get: `setmaxnreg` is ignored (ptxas C7508)
/// unless the kernel has a register cap at entry, which `.maxntid` with
/// `.minnctapersm 1` gives (rustc has no launch-bounds attribute).
/// Threads: 128 per warpgroup, the producer and 2 consumers, or 3 consumers
/// for the kernels named `*_w3*`; the backward's as the forward's.
const HOPPER_ENTRY_PREFIXES: [&str; 2] = [".entry flash_fwd_hopper_", ".entry flash_bwd_hopper_"];
const HOPPER_ENTRY_DIRECTIVES: &str = ".maxntid 384, 1, 1\n.minnctapersm 1";
const HOPPER_ENTRY_DIRECTIVES_W3: &str = ".maxntid 512, 1, 1\n.minnctapersm 1";

/// Builds the kernel crate in `kernel_dir` for every [`ARCHS`] entry (in
/// parallel, one nested cargo each, target dirs `target_root/kernels-ARCH`)
/// with the pinned toolchain `tc`; returns `(arch, PTX)` in [`ARCHS`] order.
pub fn build(kernel_dir: &Path, tc: &Toolchain, target_root: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let mut children = Vec::new();
    for &(arch, ptx) in ARCHS {
        let target_dir = target_root.join(format!("kernels-{arch}"));
        let mut cmd = Command::new(&tc.cargo);
        clean_env(&mut cmd);
        // `fa_ptx74`: instructions of PTX ISA ≥ 7.4 (the L2 prefetch
        // hints of `cp.async`), absent from the ISA 7.1 portable build.
        let extra: &[&str] = match arch {
            "sm_90a" => &["--cfg", "fa_sm90a", "--cfg", "fa_ptx74"],
            "sm_90" => &["--cfg", "fa_ptx74"],
            _ => &[],
        };
        let flags = [
            &format!("-Ctarget-cpu={arch}"),
            &format!("-Ctarget-feature={ptx}"),
            "-Clinker=/bin/true",
            // The tensor-core kernels keep their fragments in register
            // arrays indexed by loop counters: every such loop must be fully
            // unrolled, or the arrays go to local memory (a stack frame in
            // `ptxas -v`). LLVM's default threshold stops short on the
            // d = 128 nests.
            "-Cllvm-args=-unroll-threshold=5000",
            "-Awarnings",
        ];
        let flags: Vec<&str> = flags.iter().copied().chain(extra.iter().copied()).collect();
        cmd.current_dir(kernel_dir).env("RUSTC", &tc.rustc).env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
        for (k, v) in PROFILE {
            cmd.env(format!("CARGO_PROFILE_RELEASE_{k}"), v);
        }
        // The host sees an empty rlib; the device build is the cdylib whose
        // `--emit=asm` output is the PTX module.
        cmd.args(["rustc", "--quiet", "--lib", "--release", "--crate-type", "cdylib"])
            .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--", "--emit=asm"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|e| format!("cannot run `{}` to build the kernels: {e}", tc.cargo.display()))?;
        children.push((arch, target_dir, child));
    }
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for (arch, target_dir, child) in children {
        let res = child.wait_with_output().map_err(|e| format!("waiting for the kernel build: {e}"))?;
        if !res.status.success() {
            failed.push(format!(
                "building {} for nvptx64-nvidia-cuda ({arch}) with {} failed:\n{}{}",
                kernel_dir.display(),
                tc.channel,
                String::from_utf8_lossy(&res.stdout),
                String::from_utf8_lossy(&res.stderr)
            ));
            continue;
        }
        let asm = asm_output(&target_dir.join("nvptx64-nvidia-cuda/release/deps"))?;
        let ptx = std::fs::read_to_string(&asm).map_err(|e| format!("read {}: {e}", asm.display()))?;
        out.push((arch, if arch == "sm_90a" { add_hopper_entry_directives(&ptx)? } else { ptx }));
    }
    if failed.is_empty() { Ok(out) } else { Err(failed.join("\n")) }
}

/// The newest `flash_attn_kernels*.s` of a `deps` folder.
fn asm_output(deps: &Path) -> Result<PathBuf, String> {
    let entries = std::fs::read_dir(deps).map_err(|e| format!("read {}: {e}", deps.display()))?;
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "s")
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("flash_attn_kernels"))
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .ok_or_else(|| format!("the kernel build left no flash_attn_kernels*.s in {}", deps.display()))
}

/// Inserts [`HOPPER_ENTRY_DIRECTIVES`] after the parameter list of every
/// entry named `flash_fwd_hopper_*` or `flash_bwd_hopper_*` (between its
/// closing `)` and `{`).
fn add_hopper_entry_directives(ptx: &str) -> Result<String, String> {
    let mut out = String::with_capacity(ptx.len() + 4096);
    let mut in_hopper_params = false;
    let mut w3 = false;
    let mut edited = 0;
    for line in ptx.lines() {
        if HOPPER_ENTRY_PREFIXES.iter().any(|p| line.contains(p)) {
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
    if edited == 0 {
        return Err("sm_90a PTX: no flash_fwd_hopper_* entry found to add .maxntid to".into());
    }
    Ok(out)
}

/// The nested cargo must not inherit the outer build's toolchain, flags,
/// target or wrappers (they are for the host target, maybe another
/// toolchain).
fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        let keep = matches!(k, "CARGO_HOME" | "CARGO_MAKEFLAGS" | "CARGO_NET_OFFLINE" | "CARGO_REGISTRIES_CRATES_IO_PROTOCOL");
        let outer = k.starts_with("CARGO_")
            || k.starts_with("__CARGO")
            || k.starts_with("RUSTC")
            || matches!(k, "CARGO" | "RUSTFLAGS" | "RUSTDOC" | "RUSTDOCFLAGS" | "RUSTUP_TOOLCHAIN");
        if outer && !keep {
            cmd.env_remove(k);
        }
    }
}
