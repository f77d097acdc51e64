//! The cubin pack: the kernels of one PTX build assembled ahead of time by
//! `ptxas` (one cubin per kernel entry, each from the entry's own split
//! module, [`super::SplitPtx::module`]), in one file with a text index.
//!
//! ```text
//! flash-attn cubins 1
//! arch sm_90a
//! ptx <SHA-256 of the PTX text the cubins were assembled from>
//! ptxas <version, e.g. 13.5.37>
//! codec raw|lz4
//! entry <name> <offset> <stored length> <cubin length>
//! …
//! end
//! <the stored cubins, back to back; offsets count from here>
//! ```
//!
//! `raw` stores the cubins as they are: the file shipped in the package
//! (`host-crate/ptx/flash_attn_ARCH.cubins.xz`, compressed whole by `xz`:
//! the cubins of one build share most of their code, so one stream packs
//! them about 2.8 times smaller than a stream per kernel). `lz4` stores each
//! cubin compressed on its own (LZ4 block format): what `build.rs` embeds,
//! so that the first use of a kernel decompresses that kernel alone, in
//! about a millisecond.
//!
//! This file uses nothing but `std` (`build.rs` and `cargo xtask` include it
//! with `#[path]`).

use std::fmt::Write as _;

/// The first line of every pack.
const MAGIC: &str = "flash-attn cubins 1";

/// How each stored cubin is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// As `ptxas` wrote it.
    Raw,
    /// An LZ4 block (no frame), decompressing to the entry's `len` bytes.
    Lz4,
}

// The writer's half (`name`, `render`) serves build.rs and xtask; the
// library only reads.
#[allow(dead_code)]
impl Codec {
    fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Lz4 => "lz4",
        }
    }
}

/// One kernel's cubin in a pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackEntry<'a> {
    pub name: &'a str,
    /// The stored bytes (encoded as the pack's [`Codec`] says).
    pub stored: &'a [u8],
    /// The cubin's length once decoded.
    pub len: usize,
}

/// A parsed pack, borrowing the bytes it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pack<'a> {
    /// The PTX target the cubins were assembled for (`sm_80`, `sm_90a`).
    pub arch: &'a str,
    /// SHA-256 (hex) of the whole PTX text of the build they come from.
    pub ptx_sha256: &'a str,
    /// The `ptxas` release that assembled them (`13.5.37`).
    pub ptxas: &'a str,
    pub codec: Codec,
    /// In the PTX's entry order.
    pub entries: Vec<PackEntry<'a>>,
}

impl<'a> Pack<'a> {
    /// Reads a pack: the index, then checks that every entry lies within
    /// the data and the entries tile it exactly.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let end_marker = b"\nend\n";
        let header_end = bytes
            .windows(end_marker.len())
            .position(|w| w == end_marker)
            .ok_or("cubin pack: no `end` line")?
            + end_marker.len();
        let header = std::str::from_utf8(&bytes[..header_end]).map_err(|_| "cubin pack: the index is not UTF-8")?;
        let data = &bytes[header_end..];
        let mut lines = header.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("cubin pack: the first line is not `{MAGIC}`"));
        }
        let mut field = |key: &str| {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|v| v.strip_prefix(' '))
                .ok_or_else(|| format!("cubin pack: `{key}` line missing"))
        };
        let arch = field("arch")?;
        let ptx_sha256 = field("ptx")?;
        let ptxas = field("ptxas")?;
        let codec = match field("codec")? {
            "raw" => Codec::Raw,
            "lz4" => Codec::Lz4,
            other => return Err(format!("cubin pack: unknown codec `{other}`")),
        };
        let mut entries = Vec::new();
        let mut next = 0usize;
        for line in lines {
            if line == "end" {
                break;
            }
            let bad = || format!("cubin pack: cannot read `{line}`");
            let w: Vec<&str> = line.split(' ').collect();
            let [ "entry", name, off, stored, len] = w.as_slice() else { return Err(bad()) };
            let (off, stored, len): (usize, usize, usize) =
                (off.parse().map_err(|_| bad())?, stored.parse().map_err(|_| bad())?, len.parse().map_err(|_| bad())?);
            if off != next || off.checked_add(stored).is_none_or(|e| e > data.len()) {
                return Err(format!("cubin pack: entry `{name}` at {off}+{stored} does not follow the previous one within {} bytes", data.len()));
            }
            if codec == Codec::Raw && stored != len {
                return Err(bad());
            }
            entries.push(PackEntry { name, stored: &data[off..off + stored], len });
            next = off + stored;
        }
        if next != data.len() {
            return Err(format!("cubin pack: {} bytes after the last entry", data.len() - next));
        }
        Ok(Self { arch, ptx_sha256, ptxas, codec, entries })
    }

    /// The entry of kernel `name`.
    pub fn entry(&self, name: &str) -> Option<&PackEntry<'a>> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// Writes a pack of `entries` (name, stored bytes, decoded length).
#[allow(dead_code)]
pub fn render(arch: &str, ptx_sha256: &str, ptxas: &str, codec: Codec, entries: &[(&str, &[u8], usize)]) -> Vec<u8> {
    let mut s = format!("{MAGIC}\narch {arch}\nptx {ptx_sha256}\nptxas {ptxas}\ncodec {}\n", codec.name());
    let mut off = 0;
    for (name, stored, len) in entries {
        let _ = writeln!(s, "entry {name} {off} {} {len}", stored.len());
        off += stored.len();
    }
    s.push_str("end\n");
    let mut out = s.into_bytes();
    for (_, stored, _) in entries {
        out.extend_from_slice(stored);
    }
    out
}

/// Whether a cubin assembled for `arch` (`sm_XY`, or `sm_XYa`) runs on a
/// device of compute capability `(major, minor)`. The CUDA binary
/// compatibility rule: a cubin of `sm_XY` runs on devices of the same major
/// revision `X` and a minor revision of at least `Y` (`sm_80` on 8.0, 8.6,
/// 8.7 and 8.9; never on 9.0, which needs `sm_90` code or the PTX); an
/// arch-specific `sm_XYa` cubin runs on `X.Y` alone. Unknown names: no.
pub fn cubin_runs_on(arch: &str, major: i32, minor: i32) -> bool {
    let Some(v) = arch.strip_prefix("sm_") else { return false };
    let (digits, specific) = match v.strip_suffix('a') {
        Some(d) => (d, true),
        None => (v, false),
    };
    let Ok(n) = digits.parse::<i32>() else { return false };
    if digits.len() < 2 {
        return false;
    }
    let (x, y) = (n / 10, n % 10);
    if specific { (major, minor) == (x, y) } else { major == x && minor >= y }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks_bounds() {
        let (a, b) = (b"\x7fELFone".as_slice(), b"two!".as_slice());
        let bytes = render("sm_90a", &"ab".repeat(32), "13.5.37", Codec::Raw, &[("k1", a, a.len()), ("k2", b, b.len())]);
        let p = Pack::parse(&bytes).unwrap();
        assert_eq!((p.arch, p.ptxas, p.codec), ("sm_90a", "13.5.37", Codec::Raw));
        assert_eq!(p.ptx_sha256, "ab".repeat(32));
        assert_eq!(p.entry("k2").unwrap().stored, b"two!");
        assert_eq!(p.entries.iter().map(|e| e.name).collect::<Vec<_>>(), ["k1", "k2"]);
        assert!(p.entry("k3").is_none());
        // Truncated data, a trailing byte, a wrong magic: refused.
        assert!(Pack::parse(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Pack::parse(&longer).is_err());
        assert!(Pack::parse(&bytes[1..]).is_err());
        let empty = render("sm_80", "00", "13.5.37", Codec::Lz4, &[]);
        assert!(Pack::parse(&empty).unwrap().entries.is_empty());
    }

    #[test]
    fn binary_compatibility_rule() {
        for (arch, cc, runs) in [
            ("sm_80", (8, 0), true),
            ("sm_80", (8, 6), true),
            ("sm_80", (8, 9), true),
            ("sm_80", (9, 0), false),
            ("sm_80", (7, 5), false),
            ("sm_86", (8, 0), false),
            ("sm_90", (9, 0), true),
            ("sm_90", (10, 0), false),
            ("sm_90", (12, 0), false),
            ("sm_90a", (9, 0), true),
            ("sm_90a", (9, 1), false),
            ("sm_100a", (10, 0), true),
            ("compute_90", (9, 0), false),
        ] {
            assert_eq!(cubin_runs_on(arch, cc.0, cc.1), runs, "{arch} on {cc:?}");
        }
    }
}
