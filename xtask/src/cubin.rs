//! `cargo xtask ship-cubins`: assemble the shipped PTX into cubins ahead of
//! time, one per kernel entry, with the pinned `ptxas`
//! ([`cubins::PINNED_PTXAS`], PyPI `nvidia-cuda-nvcc`), and write them
//! beside the PTX (`host-crate/ptx/flash_attn_ARCH.cubins.xz`: a raw cubin
//! pack, `host-crate/src/ptx/pack.rs`, compressed whole; and `cubins.txt`).
//! The library loads a kernel's cubin where the device's compute capability
//! runs it, and JIT-compiles its PTX elsewhere.
//!
//! Each cubin is assembled from the entry's own split module (the module the
//! library JIT-compiles when it falls back to the PTX), so cubin and PTX
//! hold the same kernel. `ptxas` output is deterministic byte for byte (the
//! same module assembles to the same bytes whatever the file's path), which
//! [`check`] relies on: `cargo xtask test` re-assembles every kernel and
//! compares.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::ptx_build::{self, inputs, sha256};
use crate::{cargo, ptx, ship};

#[path = "../../host-crate/build/cubins.rs"]
pub mod cubins;
#[path = "../../host-crate/src/ptx/pack.rs"]
#[allow(dead_code)]
mod pack;

use cubins::{CubinManifest, PINNED_PTXAS, ShippedCubins};

const HELP: &str = "usage: cargo xtask ship-cubins [--check]

Assembles every kernel of the shipped PTX (host-crate/ptx/flash_attn_*.ptx.xz) into a
cubin with ptxas {PINNED} (python3 -m pip install nvidia-cuda-nvcc=={PINNED}) and
rewrites host-crate/ptx/flash_attn_*.cubins.xz and cubins.txt. Needs no nightly.
--check: only compare the shipped cubins with the shipped PTX and, with that ptxas,
with what it assembles (the check `cargo xtask test` runs).";

pub fn main(args: &[String]) -> Result<(), String> {
    if args.len() == 1 && args[0] == "--check" {
        println!("xtask: {}", check()?);
        return Ok(());
    }
    if !args.is_empty() {
        println!("{}", HELP.replace("{PINNED}", PINNED_PTXAS));
        return if args.iter().any(|a| a == "-h" || a == "--help") { Ok(()) } else { Err("no arguments expected".into()) };
    }
    let ptxas = pinned_ptxas().ok_or_else(missing_ptxas)?;
    let shipped = shipped_ptx()?;
    ship(&ptxas, &shipped)
}

fn missing_ptxas() -> String {
    format!("ptxas {PINNED_PTXAS} not found ($PTXAS, PATH, or `python3 -m pip install --user nvidia-cuda-nvcc=={PINNED_PTXAS}`)")
}

/// The `ptxas` of release [`PINNED_PTXAS`]: `$PTXAS`, `PATH`, or the pip
/// wheels (`nvidia/cu13/bin`, `nvidia/cuda_nvcc/bin`), the first whose
/// `--version` names it.
pub fn pinned_ptxas() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    candidates.extend(std::env::var_os("PTXAS").map(PathBuf::from));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("ptxas")));
    }
    candidates.extend(ptx::find_ptxas());
    if let Ok(out) = Command::new("python3").args(["-c", "import nvidia; print('\\n'.join(nvidia.__path__))"]).output() {
        for dir in String::from_utf8_lossy(&out.stdout).lines() {
            candidates.extend(["cu13/bin/ptxas", "cuda_nvcc/bin/ptxas"].map(|s| Path::new(dir.trim()).join(s)));
        }
    }
    candidates.into_iter().filter(|p| p.is_file()).find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(", V{PINNED_PTXAS}")))
    })
}

/// The shipped PTX, decompressed and checked against the manifest:
/// `(arch, PTX text, its SHA-256)` per target.
pub fn shipped_ptx() -> Result<Vec<(String, String, String)>, String> {
    let dir = ptx_build::ship_dir();
    let text = std::fs::read_to_string(dir.join("manifest.txt")).map_err(|e| format!("read host-crate/ptx/manifest.txt: {e}"))?;
    let m = inputs::Manifest::parse(&text)?;
    let mut out = Vec::new();
    for p in &m.ptx {
        let xz = std::fs::read(dir.join(p.file_name())).map_err(|e| format!("read {}: {e}", p.file_name()))?;
        let bytes = ship::xz_decompress(&xz)?;
        let sha = sha256::hex(&bytes);
        if bytes.len() != p.len || sha != p.sha256 {
            return Err(format!("{} does not hold the PTX manifest.txt records: run `cargo xtask ship-ptx`", p.file_name()));
        }
        let text = String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8", p.file_name()))?;
        out.push((p.arch.clone(), text, sha));
    }
    Ok(out)
}

/// Assembles every entry of `ptx` (target `arch`) on its own with `ptxas`,
/// on as many threads as there are cores: `(entry, cubin)` in entry order.
pub fn assemble(ptxas: &Path, arch: &str, ptx: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let split = ptx::split::SplitPtx::parse(ptx).map_err(|e| format!("{arch}: split: {e}"))?;
    let entries: Vec<&str> = split.entries().to_vec();
    let dir = std::env::temp_dir().join(format!("fa-cubins-{}-{arch}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let next = Mutex::new(0usize);
    // One slot per entry: its cubin or why ptxas failed, once assembled.
    type Slot = Option<Result<Vec<u8>, String>>;
    let results: Mutex<Vec<Slot>> = Mutex::new(vec![None; entries.len()]);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(&entry) = entries.get(i) else { break };
                    let r = assemble_one(ptxas, arch, &dir, entry, &split);
                    results.lock().unwrap()[i] = Some(r);
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    let results = results.into_inner().unwrap();
    entries.iter().zip(results).map(|(e, r)| r.expect("every entry assembled").map(|c| (e.to_string(), c))).collect()
}

fn assemble_one(ptxas: &Path, arch: &str, dir: &Path, entry: &str, split: &ptx::split::SplitPtx<'_>) -> Result<Vec<u8>, String> {
    let module = split.module(entry).ok_or_else(|| format!("{entry}: no module"))?;
    let (src, dst) = (dir.join(format!("{entry}.ptx")), dir.join(format!("{entry}.cubin")));
    std::fs::write(&src, module).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut cmd = Command::new(ptxas);
    cmd.arg(format!("-arch={arch}")).arg(&src).arg("-o").arg(&dst);
    let out = cmd.output().map_err(|e| format!("cannot run `{}`: {e}", cargo::show(&cmd)))?;
    if !out.status.success() {
        return Err(format!("{arch} {entry}: ptxas failed: {}", String::from_utf8_lossy(&out.stderr).lines().take(5).collect::<Vec<_>>().join(" | ")));
    }
    let cubin = std::fs::read(&dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    let _ = (std::fs::remove_file(&src), std::fs::remove_file(&dst));
    Ok(cubin)
}

/// Assembles the cubins of every shipped PTX and rewrites
/// `host-crate/ptx/flash_attn_*.cubins.xz` and `cubins.txt`.
pub fn ship(ptxas: &Path, shipped: &[(String, String, String)]) -> Result<(), String> {
    let dir = ptx_build::ship_dir();
    let mut packs = Vec::new();
    for (arch, text, sha) in shipped {
        let t0 = std::time::Instant::now();
        let cubins = assemble(ptxas, arch, text)?;
        let entries: Vec<(&str, &[u8], usize)> = cubins.iter().map(|(n, c)| (n.as_str(), c.as_slice(), c.len())).collect();
        let raw = pack::render(arch, sha, PINNED_PTXAS, pack::Codec::Raw, &entries);
        let xz = ship::xz(&["-9e", "--threads=1", "--check=crc64", "-c"], &raw)?;
        if ship::xz_decompress(&xz)? != raw {
            return Err(format!("xz round trip of the {arch} cubins differs"));
        }
        let path = dir.join(cubins::file_name(arch));
        std::fs::write(&path, &xz).map_err(|e| format!("write {}: {e}", path.display()))?;
        println!(
            "xtask: {} ({} kernels, {} -> {} bytes, assembled in {:.0} s)",
            path.display(),
            cubins.len(),
            raw.len(),
            xz.len(),
            t0.elapsed().as_secs_f64()
        );
        packs.push(ShippedCubins { arch: arch.clone(), len: raw.len(), ptx_sha256: sha.clone() });
    }
    let m = CubinManifest { ptxas: PINNED_PTXAS.into(), packs };
    std::fs::write(dir.join("cubins.txt"), m.render()).map_err(|e| format!("write cubins.txt: {e}"))?;
    println!("xtask: host-crate/ptx/cubins.txt (ptxas {PINNED_PTXAS})\nxtask: commit host-crate/ptx/");
    Ok(())
}

/// Removes the shipped cubins (after `ship-ptx` changed the PTX without a
/// pinned ptxas at hand: stale cubins are never embedded, but `cargo xtask
/// test` would refuse them).
pub fn remove_shipped() -> Result<(), String> {
    let dir = ptx_build::ship_dir();
    for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let p = e.map_err(|e| e.to_string())?.path();
        let name = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if name.ends_with(".cubins.xz") || name == "cubins.txt" {
            std::fs::remove_file(&p).map_err(|e| format!("remove {}: {e}", p.display()))?;
        }
    }
    Ok(())
}

/// `cargo xtask test`'s check of the shipped cubins: `cubins.txt` names a
/// pack for every shipped PTX, assembled from exactly that PTX (its
/// SHA-256) by [`PINNED_PTXAS`], holding every kernel entry in order; and,
/// when that `ptxas` is found, every cubin equals byte for byte what it
/// makes of the kernel's split module now. Returns the summary line.
pub fn check() -> Result<String, String> {
    let dir = ptx_build::ship_dir();
    let text = std::fs::read_to_string(dir.join("cubins.txt"))
        .map_err(|e| format!("read host-crate/ptx/cubins.txt: {e} (run `cargo xtask ship-cubins`)"))?;
    let m = CubinManifest::parse(&text)?;
    if m.ptxas != PINNED_PTXAS {
        return Err(format!("the shipped cubins come from ptxas {}, the pinned one is {PINNED_PTXAS}: run `cargo xtask ship-cubins`", m.ptxas));
    }
    let shipped = shipped_ptx()?;
    let ptxas = pinned_ptxas();
    let mut problems = Vec::new();
    let mut kernels = 0;
    for (arch, ptx_text, sha) in &shipped {
        let Some(p) = m.pack(arch) else {
            problems.push(format!("no cubins for {arch}"));
            continue;
        };
        if &p.ptx_sha256 != sha {
            problems.push(format!("the {arch} cubins were assembled from other PTX (sha256 {}, the shipped PTX is {sha})", p.ptx_sha256));
            continue;
        }
        let raw = ship::xz_decompress(&std::fs::read(dir.join(p.file_name())).map_err(|e| format!("read {}: {e}", p.file_name()))?)?;
        if raw.len() != p.len {
            problems.push(format!("{}: {} bytes, cubins.txt says {}", p.file_name(), raw.len(), p.len));
            continue;
        }
        let pk = pack::Pack::parse(&raw).map_err(|e| format!("{}: {e}", p.file_name()))?;
        let split = ptx::split::SplitPtx::parse(ptx_text)?;
        let names: Vec<&str> = pk.entries.iter().map(|e| e.name).collect();
        if (pk.arch, pk.ptx_sha256, pk.ptxas, pk.codec) != (arch.as_str(), sha.as_str(), PINNED_PTXAS, pack::Codec::Raw) || names != split.entries() {
            problems.push(format!("{}: its index does not match the {arch} PTX (arch, hash, ptxas or entries)", p.file_name()));
            continue;
        }
        kernels += names.len();
        if let Some(ptxas) = &ptxas {
            let t0 = std::time::Instant::now();
            for (name, cubin) in assemble(ptxas, arch, ptx_text)? {
                if pk.entry(&name).map(|e| e.stored) != Some(cubin.as_slice()) {
                    problems.push(format!("{arch} {name}: the shipped cubin is not what ptxas {PINNED_PTXAS} assembles"));
                }
            }
            println!("xtask: {arch}: {} cubins re-assembled and compared in {:.0} s", names.len(), t0.elapsed().as_secs_f64());
        }
    }
    if !problems.is_empty() {
        return Err(format!("shipped cubins: {} (run `cargo xtask ship-cubins`)", problems.join("; ")));
    }
    Ok(match ptxas {
        Some(_) => format!("shipped cubins ({kernels} kernels) identical to what ptxas {PINNED_PTXAS} assembles"),
        None => format!(
            "shipped cubins ({kernels} kernels) match the shipped PTX's hash; byte comparison skipped: {}",
            missing_ptxas()
        ),
    })
}
