//! PTX checks: assemble every embedded PTX with `ptxas -v` for the arch its
//! `.target` names and fail on local-memory use (spill stores or loads, or a
//! stack frame) in any function, or on a kernel missing an instruction it is
//! meant to use ([`REQUIRED`]).
//!
//! The PTX files are the ones `host-crate/build.rs` embeds: we build what
//! `cargo test --workspace` builds and take the `flash-attn` build script's
//! `OUT_DIR` from cargo's JSON messages, so the files checked are exactly the
//! files compiled into the library the tests ran.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cargo;

/// The library's own splitter (one module per kernel entry, loaded on first
/// use), shared by path so that xtask needs no dependency on the library.
#[path = "../../host-crate/src/ptx/split.rs"]
#[allow(dead_code)]
pub mod split;

/// Every `SPLIT_SAMPLE_STRIDE`-th entry of each build (and the first of
/// each family prefix in [`SPLIT_SAMPLE_FAMILIES`]) is assembled on its own.
pub const SPLIT_SAMPLE_STRIDE: usize = 24;
pub const SPLIT_SAMPLE_FAMILIES: &[&str] =
    &["fa2_forward_f32", "flash_fwd_tc_fa2_", "flash_fwd_tc_dec_", "flash_fwd_hopper_", "combine_splits_", "order_block_table"];

/// Assembles a sample of the per-entry modules the library loads (its
/// run-time split of each PTX file) with ptxas, each as a stand-alone
/// file: proof that a split module is valid PTX on its own. Returns the
/// number assembled and the problems.
pub fn check_split(ptxas: &Path, files: &[PtxFile]) -> Result<(usize, Vec<String>), String> {
    let mut problems = Vec::new();
    let mut n = 0;
    let dir = std::env::temp_dir().join(format!("fa-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for f in files {
        let sp = split::SplitPtx::parse(&f.text).map_err(|e| format!("{}: split: {e}", f.path.display()))?;
        let entries = sp.entries();
        let mut sample: Vec<&str> = entries.iter().step_by(SPLIT_SAMPLE_STRIDE).copied().collect();
        for fam in SPLIT_SAMPLE_FAMILIES {
            if let Some(e) = entries.iter().find(|e| e.starts_with(fam)) {
                sample.push(e);
            }
        }
        sample.sort_unstable();
        sample.dedup();
        for entry in sample {
            let m = sp.module(entry).ok_or_else(|| format!("{entry}: no module"))?;
            let path = dir.join(format!("{}_{entry}.ptx", f.target));
            std::fs::write(&path, &m).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut cmd = Command::new(ptxas);
            cmd.arg(format!("-arch={}", f.target)).arg(&path).args(["-o", "/dev/null"]);
            let out = cmd.output().map_err(|e| format!("cannot run `{}`: {e}", cargo::show(&cmd)))?;
            n += 1;
            if !out.status.success() {
                problems.push(format!(
                    "{} ({}): the split module of {entry} does not assemble on its own: {}",
                    f.path.display(),
                    f.target,
                    String::from_utf8_lossy(&out.stderr).lines().take(5).collect::<Vec<_>>().join(" | ")
                ));
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    Ok((n, problems))
}

/// Instructions a kernel must contain, by kernel-name prefix: the PTX
/// counterpart of "the instructions we meant are there" (DESIGN.md, tests
/// tier 4). Each `(prefix, substrings)` applies to every `.entry` whose name
/// starts with `prefix`; each substring must occur in that entry's body.
/// (Only the entry's own body is searched: all device code is inlined into
/// the entries by the fat-LTO build; a `.func` it calls is not searched.)
pub const REQUIRED: &[(&str, &[&str])] = &[
    // Tensor-core kernels (kernel-crate/src/tc), FA2 and FA1: HMMA via
    // mma.sync m16n8k16, fragments from shared memory via ldmatrix (V through
    // a transposing form: x4, or x2 in the d 256 FP8-cache decode builds),
    // global->shared 16-byte copies via cp.async.cg.
    (
        "flash_fwd_tc_",
        &[
            "mma.sync.aligned.m16n8k16",
            "ldmatrix.sync.aligned",
            ".trans.shared.b16",
            "cp.async.cg.shared.global",
        ],
    ),

    // Tensor-core backward main kernels (kernel-crate/src/tc/bwd.rs): HMMA,
    // ldmatrix (dO/Q/K through .trans, dSᵀ as a transposed A operand),
    // cp.async of the tiles (16 B) and of LSE/D rows (4 B), the dQ
    // accumulation as f32 reductions in the L2.
    (
        "flash_bwd_tc",
        &[
            "mma.sync.aligned.m16n8k16",
            "ldmatrix.sync.aligned.m8n8.x4.trans",
            "cp.async.cg.shared.global",
            "cp.async.ca.shared.global",
            "red.relaxed.gpu.global.add.f32",
        ],
    ),
    // f32 FA2-order backward (kernel-crate/src/bwd/fa2.rs): dQ added with
    // f32 reductions in the L2, ordered by acquire loads of the semaphores
    // in deterministic mode.
    ("bwd_fa2_f32", &["red.relaxed.gpu.global.add.f32", "ld.acquire.gpu.global.u32", "atom.acq_rel.gpu.global.add.u32"]),
];

/// Instructions the Hopper-native kernels must contain, checked only in
/// the sm_90a PTX (the other builds do not have these kernels): wgmma
/// products, TMA copies, mbarrier waits and the register reallocation of the
/// warp-specialized roles. The sm_90a file itself must exist
/// ([`HOPPER_TARGET`]).
pub const REQUIRED_SM90A: &[(&str, &[&str])] = &[
    (
        "flash_fwd_hopper_",
        &[
            "wgmma.mma_async.sync.aligned",
            "cp.async.bulk.tensor",
            "mbarrier.try_wait",
            "mbarrier.arrive",
            "setmaxnreg.inc",
            "setmaxnreg.dec",
        ],
    ),
    // Hopper backward (kernel-crate/src/hopper/bwd.rs, bwd256.rs; the prefix
    // also takes the softcap/ALiBi kernels `flash_bwd_hopper_x_*`): wgmma
    // products (the dQ product with both operands transposed), TMA copies
    // completing on mbarriers, dQ added by TMA tensor reductions from shared
    // memory, the producer/consumer register split.
    (
        "flash_bwd_hopper_",
        &[
            "wgmma.mma_async.sync.aligned.m64n",
            "p, 1, 1, 1, 1;",
            "cp.async.bulk.tensor.4d",
            "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group",
            "mbarrier.try_wait",
            "setmaxnreg.inc",
            "setmaxnreg.dec",
        ],
    ),
    // d 256 (bwd256.rs): Sᵀ, dPᵀ per consumer as m64n32 halves, dV, dK from
    // Pᵀ, dSᵀ in shared memory (A K-major, B transposed), dQ m64n128.
    ("flash_bwd_hopper_f16_d256", &["wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16", "p, 1, 1, 0, 1;", "wgmma.mma_async.sync.aligned.m64n128k16"]),
    ("flash_bwd_hopper_bf16_d256", &["wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16", "p, 1, 1, 0, 1;", "wgmma.mma_async.sync.aligned.m64n128k16"]),
    // FP8 forward (kernel-crate/src/hopper/fp8.rs): e4m3 products k32 (both
    // forms), P rounded to e4m3, V transposed by byte permutes.
    (
        "flash_fwd_hopper_e4m3_",
        &[
            "k32.f32.e4m3.e4m3",
            "cvt.rn.satfinite.e4m3x2.f32",
            "prmt.b32",
            "cp.async.bulk.tensor",
            "setmaxnreg.dec",
        ],
    ),
];
/// The `.target` of the Hopper-native build.
pub const HOPPER_TARGET: &str = "sm_90a";

/// ptxas messages that fail the check: `setmaxnreg` ignored for want of a
/// register cap at entry (C7508), and wgmma serialized (a performance bug:
/// the products lose their asynchrony).
pub const FORBIDDEN_PTXAS_MESSAGES: &[&str] = &["C7508", "serialized"];

/// Where `ptxas` is: `$PTXAS`, then `PATH`, then the `nvidia-cuda-nvcc` pip
/// wheel (`<site-packages>/nvidia/cu13/bin/ptxas`, or `cuda_nvcc/bin` for
/// CUDA 12 wheels).
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    if let Some(path) = std::env::var_os("PATH")
        && let Some(p) = std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.is_file())
    {
        return Some(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia; print('\\n'.join(nvidia.__path__))"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .flat_map(|dir| ["cu13/bin/ptxas", "cuda_nvcc/bin/ptxas"].map(|sub| Path::new(dir.trim()).join(sub)))
        .find(|p| p.is_file())
}

/// One embedded PTX file.
pub struct PtxFile {
    pub path: PathBuf,
    /// The `.target` directive (`sm_80`, `sm_90`, …): the `-arch` for ptxas.
    pub target: String,
    pub text: String,
}

/// Builds the library (as `cargo test --workspace [profile_args]` does) and
/// returns its embedded PTX files, sorted by name.
pub fn locate(profile_args: &[String]) -> Result<Vec<PtxFile>, String> {
    let out_dir = cargo::build_script_out_dir("flash-attn", profile_args)?;
    let mut files = Vec::new();
    let entries = std::fs::read_dir(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("flash_attn_sm_") && name.ends_with(".ptx") {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let target = text
                .lines()
                .find_map(|l| l.trim().strip_prefix(".target "))
                .map(|t| t.split([',', ' ']).next().unwrap_or("").to_string())
                .ok_or_else(|| format!("{}: no .target directive", path.display()))?;
            files.push(PtxFile { path, target, text });
        }
    }
    if files.is_empty() {
        return Err(format!("no flash_attn_sm_*.ptx in {}", out_dir.display()));
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The `.entry` kernels of a PTX text, with their bodies.
pub fn entries(ptx: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = ptx.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.split_once(".entry ").map(|(_, r)| r) else { continue };
        let name = rest.split(['(', ' ']).next().unwrap_or("").trim().to_string();
        let mut body = String::new();
        for l in lines.by_ref() {
            if l == "}" {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        out.push((name, body));
    }
    out
}

/// Local-memory figures of one function in `ptxas -v`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FnProps {
    pub name: String,
    pub stack: u64,
    pub spill_stores: u64,
    pub spill_loads: u64,
}

/// One kernel of the `ptxas -v` report.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelReport {
    pub name: String,
    /// The `Used N registers, …` line.
    pub usage: String,
    /// The kernel's own properties and those of every function it calls.
    pub functions: Vec<FnProps>,
}

/// Parses `ptxas -v` output (the `ptxas info` lines).
pub fn parse_report(text: &str) -> Vec<KernelReport> {
    let mut kernels: Vec<KernelReport> = Vec::new();
    let mut pending: Option<String> = None; // "Function properties for X"
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.split_once("Compiling entry function '").map(|(_, r)| r) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            kernels.push(KernelReport { name, ..Default::default() });
        } else if let Some(rest) = l.split_once("Function properties for ").map(|(_, r)| r) {
            pending = Some(rest.trim().to_string());
        } else if l.contains("bytes stack frame") {
            let nums: Vec<u64> = l.split(',').filter_map(|part| part.split_whitespace().next()?.parse().ok()).collect();
            if let (Some(name), Some(k), &[stack, st, ld]) = (pending.take(), kernels.last_mut(), nums.as_slice()) {
                k.functions.push(FnProps { name, stack, spill_stores: st, spill_loads: ld });
            }
        } else if let Some(rest) = l.split_once(": Used ").map(|(_, r)| r)
            && let Some(k) = kernels.last_mut().filter(|k| k.usage.is_empty())
        {
            k.usage = format!("Used {rest}");
        }
    }
    kernels
}

/// Result of checking every PTX file.
pub struct Summary {
    pub files: usize,
    pub kernels: usize,
    pub targets: Vec<String>,
    pub problems: Vec<String>,
}

/// Assembles each file with `ptxas -arch=<.target> -v`, printing the report
/// (one line per kernel, or the full detail with `verbose`), and collects
/// every problem: ptxas errors, spills, stack frames, missing instructions.
pub fn check(ptxas: &Path, files: &[PtxFile], verbose: bool) -> Result<Summary, String> {
    let mut sum = Summary { files: files.len(), kernels: 0, targets: Vec::new(), problems: Vec::new() };
    for f in files {
        let mut cmd = Command::new(ptxas);
        cmd.arg(format!("-arch={}", f.target)).arg("-v").arg(&f.path).args(["-o", "/dev/null"]);
        let shown = cargo::show(&cmd);
        let out = cmd.output().map_err(|e| format!("cannot run `{shown}`: {e}"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("\n== {} ({}): {} ==", f.path.display(), f.target, shown);
        if !out.status.success() {
            print!("{text}");
            sum.problems.push(format!("{}: ptxas failed ({})", f.path.display(), out.status));
            continue;
        }
        for l in text.lines().filter(|l| l.contains("warning")) {
            println!("  {l}");
        }
        for l in text.lines().filter(|l| FORBIDDEN_PTXAS_MESSAGES.iter().any(|m| l.contains(m))) {
            sum.problems.push(format!("{} ({}): ptxas says: {}", f.path.display(), f.target, l.trim()));
        }
        sum.targets.push(f.target.clone());
        let report = parse_report(&text);
        let ptx_entries = entries(&f.text);
        for (name, _) in &ptx_entries {
            if !report.iter().any(|k| &k.name == name) {
                sum.problems.push(format!(
                    "{} ({}): kernel {name} missing from the ptxas report",
                    f.path.display(),
                    f.target
                ));
            }
        }
        for k in &report {
            sum.kernels += 1;
            let own = k.functions.iter().find(|p| p.name == k.name).cloned().unwrap_or_default();
            println!(
                "  {:<48} {}; stack {} B, spill st/ld {}/{} B",
                k.name, k.usage, own.stack, own.spill_stores, own.spill_loads
            );
            for p in &k.functions {
                if verbose && p.name != k.name {
                    println!(
                        "      calls {}: stack {} B, spill st/ld {}/{} B",
                        p.name, p.stack, p.spill_stores, p.spill_loads
                    );
                }
                if p.stack != 0 || p.spill_stores != 0 || p.spill_loads != 0 {
                    sum.problems.push(format!(
                        "{} ({}): kernel {} function {}: {} bytes stack frame, {} bytes spill stores, {} bytes spill loads",
                        f.path.display(),
                        f.target,
                        k.name,
                        p.name,
                        p.stack,
                        p.spill_stores,
                        p.spill_loads
                    ));
                }
            }
        }
        for p in missing_instructions(&ptx_entries, REQUIRED) {
            sum.problems.push(format!("{} ({}): {p}", f.path.display(), f.target));
        }
        if f.target == HOPPER_TARGET {
            for p in missing_instructions(&ptx_entries, REQUIRED_SM90A) {
                sum.problems.push(format!("{} ({}): {p}", f.path.display(), f.target));
            }
        }
    }
    if !files.iter().any(|f| f.target == HOPPER_TARGET) {
        sum.problems.push(format!("no {HOPPER_TARGET} PTX among the embedded files (host-crate/build.rs builds one)"));
    }
    Ok(sum)
}

/// The [`REQUIRED`] (or [`REQUIRED_SM90A`]) check of one PTX file's
/// entries: each kernel missing a required instruction, and each prefix no
/// kernel has (so the check cannot pass by the kernels disappearing or
/// being renamed).
pub fn missing_instructions(ptx_entries: &[(String, String)], required: &[(&str, &[&str])]) -> Vec<String> {
    let mut problems = Vec::new();
    for (prefix, needed) in required {
        let kernels: Vec<_> = ptx_entries.iter().filter(|(name, _)| name.starts_with(prefix)).collect();
        if kernels.is_empty() {
            problems.push(format!("no kernel named `{prefix}*` (required instructions {needed:?})"));
        }
        for (name, body) in kernels {
            for insn in needed.iter().filter(|i| !body.contains(*i)) {
                problems.push(format!("kernel {name} has no `{insn}`"));
            }
        }
    }
    problems
}

/// `cargo xtask ptx [--verbose] [--release]`.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut verbose = false;
    let mut profile = Vec::new();
    for a in args {
        match a.as_str() {
            "-v" | "--verbose" => verbose = true,
            "--release" => profile.push(a.clone()),
            "-h" | "--help" => {
                println!(
                    "usage: cargo xtask ptx [--verbose] [--release]\n\nBuilds what `cargo test --workspace` builds, prints the path of every PTX embedded\nin flash-attn and the `ptxas -v` report per kernel (--verbose: also the functions\neach kernel calls). Fails on spills, stack frames or missing instructions."
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument `{other}` (try --help)")),
        }
    }
    let files = locate(&profile)?;
    println!("PTX embedded in flash-attn:");
    for f in &files {
        println!("  {} ({}, {} kernels, {} bytes)", f.path.display(), f.target, entries(&f.text).len(), f.text.len());
    }
    let Some(ptxas) = find_ptxas() else {
        println!(
            "ptxas report skipped: ptxas not found (PATH, $PTXAS, or `python3 -m pip install --user nvidia-cuda-nvcc`)"
        );
        return Ok(());
    };
    let sum = check(&ptxas, &files, verbose)?;
    if sum.problems.is_empty() {
        println!("\nptx: {} kernels in {} files, no spills, no stack frames", sum.kernels, sum.files);
        Ok(())
    } else {
        Err(format!("{} problem(s):\n  {}", sum.problems.len(), sum.problems.join("\n  ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_report() {
        let text = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
ptxas info    : Compile time = 49.649 ms
ptxas info    : Function properties for panic_fmt
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem
";
        let r = parse_report(text);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].name, "k1");
        assert_eq!(r[0].usage, "Used 40 registers, used 0 barriers");
        assert_eq!(r[0].functions[1], FnProps { name: "panic_fmt".into(), stack: 8, spill_stores: 4, spill_loads: 4 });
        assert_eq!(r[1].functions[0].stack, 16);
    }

    #[test]
    fn splits_entries() {
        let ptx = ".version 8.0\n.target sm_90\n.visible .entry a(\n.param .u64 p\n)\n{\n\tmma.sync x;\n\t{\n\t}\n}\n\n.visible .entry b(\n)\n{\n\tret;\n}\n";
        let e = entries(ptx);
        assert_eq!(e.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(e[0].1.contains("mma.sync") && !e[1].1.contains("mma.sync"));
    }

    /// The forward tensor-core family's rule alone.
    fn missing_instructions_tc(e: &[(String, String)]) -> Vec<String> {
        missing_instructions(e, &REQUIRED[..1])
    }

    #[test]
    fn requires_backward_instructions_per_kernel() {
        let bwd = REQUIRED.iter().find(|(p, _)| *p == "flash_bwd_tc").expect("the backward family is checked");
        let full = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 x; ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 y; cp.async.cg.shared.global a; cp.async.ca.shared.global b; red.relaxed.gpu.global.add.f32 c;";
        let e = |name: &str, body: &str| (name.to_string(), body.to_string());
        assert!(missing_instructions(&[e("flash_bwd_tcx_bf16_d64_w8_br32_bc128", full)], std::slice::from_ref(bwd)).is_empty());
        let no_red = full.replace("red.relaxed", "atom.relaxed");
        let p = missing_instructions(&[e("flash_bwd_tc_f16_d64_w8_br64_bc128", &no_red)], std::slice::from_ref(bwd));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("red.relaxed.gpu.global.add.f32"));
    }

    #[test]
    fn requires_hopper_instructions_per_kernel() {
        let full = "wgmma.mma_async.sync.aligned.m64n128k16 x; cp.async.bulk.tensor.4d y; mbarrier.try_wait.parity z; mbarrier.arrive w; setmaxnreg.inc.sync.aligned.u32 240; setmaxnreg.dec.sync.aligned.u32 24;";
        let bwd = "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {..}, d, e, p, 1, 1, 1, 1; cp.async.bulk.tensor.4d a; cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [b, {c, d}], [e]; mbarrier.try_wait.parity f; setmaxnreg.inc.sync.aligned.u32 240; setmaxnreg.dec.sync.aligned.u32 24;";
        let e = |name: &str, body: &str| (name.to_string(), body.to_string());
        let b = e("flash_bwd_hopper_bf16_d128", bwd);
        // The d 256 kernels: the family's instructions and their own forms.
        let b256 = |name: &str, dt: &str| {
            e(name, &format!("{bwd} wgmma.mma_async.sync.aligned.m64n32k16.f32.{dt}.{dt} a; wgmma.mma_async.sync.aligned.m64n128k16.f32.{dt}.{dt} {{..}}, d, e, p, 1, 1, 0, 1;"))
        };
        let (h256, b256) = (b256("flash_bwd_hopper_f16_d256", "f16"), b256("flash_bwd_hopper_bf16_d256", "bf16"));
        // The FP8 forward: the forward's instructions and its own.
        let full8 = format!("{full} wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 a; cvt.rn.satfinite.e4m3x2.f32 b; prmt.b32 c;");
        let f8 = e("flash_fwd_hopper_e4m3_bf16_d128", &full8);
        assert!(missing_instructions(&[e("flash_fwd_hopper_f16_d128_bc128", full), b.clone(), f8.clone(), h256.clone(), b256.clone()], REQUIRED_SM90A).is_empty());
        let no_setmaxnreg = full.replace("setmaxnreg.inc", "nop");
        let p = missing_instructions(&[e("flash_fwd_hopper_f16_d128_bc128", &no_setmaxnreg), b.clone(), f8.clone(), h256.clone(), b256.clone()], REQUIRED_SM90A);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("setmaxnreg.inc"));
        let no_reduce = bwd.replace("cp.reduce.async.bulk.tensor", "red");
        let p = missing_instructions(&[e("flash_fwd_hopper_f16_d128_bc128", full), e("flash_bwd_hopper_f16_d64", &no_reduce), f8.clone(), h256.clone(), b256.clone()], REQUIRED_SM90A);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("cp.reduce.async.bulk.tensor"));
        let no_pack = full8.replace("cvt.rn.satfinite.e4m3x2", "cvt.rn.f16x2");
        let p = missing_instructions(&[e("flash_fwd_hopper_f16_d128_bc128", full), b.clone(), e("flash_fwd_hopper_e4m3_f16_d64", &no_pack), h256.clone(), b256.clone()], REQUIRED_SM90A);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("e4m3x2"));
        // The d 256 kernels without their own forms (the d 128 body).
        let p = missing_instructions(&[e("flash_fwd_hopper_f16_d128_bc128", full), b.clone(), f8.clone(), e("flash_bwd_hopper_f16_d256", bwd), b256.clone()], REQUIRED_SM90A);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p.iter().all(|m| m.contains("flash_bwd_hopper_f16_d256")));
        assert_eq!(missing_instructions(&[e("flash_fwd_tc_fa2_f16_d64", "x")], REQUIRED_SM90A).len(), 5);
    }

    #[test]
    fn requires_tensor_core_instructions_per_kernel() {
        let full = "\tcp.async.cg.shared.global [%r1], [%rd1], 16, %r2;\n\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r3, %r4, %r5, %r6}, [%r7];\n\tldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r3, %r4, %r5, %r6}, [%r7];\n\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r3, %r4, %r5, %r6}, {%r8, %r9}, {%f1, %f2, %f3, %f4};\n";
        let e = |name: &str, body: &str| (name.to_string(), body.to_string());
        assert!(missing_instructions_tc(&[e("flash_fwd_tc_fa2_f16_d64", full), e("fa2_forward_f32", "ret;")]).is_empty());
        // FA1 without the transposing ldmatrix for V, and without cp.async.
        let no_trans = full.replace(".x4.trans", ".x4").replace("cp.async.cg", "ld.global");
        let p = missing_instructions_tc(&[e("flash_fwd_tc_fa2_f16_d64", full), e("flash_fwd_tc_fa1_bf16_d64", &no_trans)]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("flash_fwd_tc_fa1_bf16_d64") && p[0].contains(".trans.shared.b16"));
        // The x2 transposing form serves too (the FP8-cache decode at d 256).
        let x2 = full.replace(".x4.trans.shared.b16 {%r3, %r4, %r5, %r6}", ".x2.trans.shared.b16 {%r3, %r4}");
        assert!(x2.contains(".x2.trans") && !x2.contains(".x4.trans"));
        assert!(missing_instructions_tc(&[e("flash_fwd_tc_dec_bf16_e4m3_d256_w4_bc64_s4", &x2)]).is_empty());
        assert!(p[1].contains("cp.async.cg.shared.global"));
        // No tensor-core kernel at all is a problem too.
        let p = missing_instructions_tc(&[e("fa2_forward_f32", "ret;")]);
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("flash_fwd_tc_"));
    }
}
