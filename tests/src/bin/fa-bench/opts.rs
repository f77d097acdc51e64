//! The command line (clap). Every flag keeps its name and meaning from the
//! hand-written parser it replaces; `--flag=value` works too, and a later
//! list flag replaces an earlier one.

use std::path::PathBuf;

use clap::{ArgAction, CommandFactory, Parser, ValueEnum};
use flash_attn::advanced::tc::TC_HEAD_DIMS;
use flash_attn_tests::bench::Dtype;

use crate::configs::IMPLS;

/// fa-bench: our FA2/FA1/standard attention vs PyTorch SDPA (flash, cuDNN, efficient, math)
#[derive(Parser, Clone, Debug)]
#[command(name = "fa-bench", args_override_self = true)]
pub struct Opts {
    /// f16,bf16
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = dtype, default_value = "f16,bf16", action = ArgAction::Set)]
    pub dtypes: Vec<Dtype>,
    /// Head dims, multiples of 32 up to 256
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "64,128", action = ArgAction::Set, overrides_with = "all_dims")]
    pub dims: Vec<usize>,
    /// Every tensor-core head dim (32, 64, ..., 256)
    #[arg(long, overrides_with = "dims")]
    pub all_dims: bool,
    /// Sequence lengths (each divides --tokens)
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "512,1024,2048,4096,8192,16384", action = ArgAction::Set)]
    pub seqlens: Vec<usize>,
    /// Causal, non-causal, or both
    #[arg(long, value_name = "WHICH", value_enum, default_value = "both")]
    pub causal: Causal,
    /// fa2,hopper,fa1,standard,torch-flash,torch-cudnn,torch-efficient,torch-math [default: all]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = impl_key, action = ArgAction::Set)]
    pub impls: Vec<&'static str>,
    /// Skip the PyTorch backends
    #[arg(long = "no-torch", action = ArgAction::SetFalse)]
    pub torch: bool,
    /// Python with torch
    #[arg(long, value_name = "PATH", default_value = "python3")]
    pub python: String,
    /// batch x seqlen
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub tokens: usize,
    /// nheads x d
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub hidden: usize,
    /// Warm-up runs per measurement
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub warmup: usize,
    /// Timed runs (median)
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub reps: usize,
    /// Rotated input sets (>= 3)
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub sets: usize,
    /// Time budget per measurement: fewer runs (>= 5) past it
    #[arg(long = "budget-s", value_name = "S", default_value_t = 5.0)]
    pub budget_s: f64,
    /// Skip FA1 above this seqlen
    #[arg(long = "fa1-max-seqlen", value_name = "N", default_value_t = 8192)]
    pub fa1_max_seqlen: usize,
    /// Skip implementations that materialize S (N x N) above this
    #[arg(long = "mem-cap-gb", value_name = "G", default_value_t = 40.0)]
    pub mem_cap_gb: f64,
    /// Correctness pass (sampled rows vs f64 CPU) before timing
    #[arg(long)]
    pub check: bool,
    /// Only the correctness pass
    #[arg(long = "check-only")]
    pub check_only: bool,
    /// Output folder
    #[arg(long, value_name = "DIR", default_value = "bench-out")]
    pub out: PathBuf,
    /// Input seed
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
}

/// `--causal`: `both`, `yes` (also `true`, `1`) or `no` (also `false`, `0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Causal {
    Both,
    #[value(alias = "true", alias = "1")]
    Yes,
    #[value(alias = "false", alias = "0")]
    No,
}

impl Causal {
    pub fn values(self) -> Vec<bool> {
        match self {
            Causal::Both => vec![false, true],
            Causal::Yes => vec![true],
            Causal::No => vec![false],
        }
    }
}

fn dtype(s: &str) -> Result<Dtype, String> {
    Dtype::parse(s).ok_or_else(|| format!("unknown dtype `{s}` (f16, bf16)"))
}

fn impl_key(s: &str) -> Result<&'static str, String> {
    IMPLS
        .iter()
        .find(|i| i.key == s.trim())
        .map(|i| i.key)
        .ok_or_else(|| format!("unknown `{s}`"))
}

impl Opts {
    /// Parsed and checked, or exits with status 2 and the reason.
    pub fn get() -> Self {
        let mut o = Opts::parse();
        if let Err(e) = o.settle() {
            Opts::command()
                .error(clap::error::ErrorKind::ValueValidation, e)
                .exit();
        }
        o
    }

    /// Defaults that depend on other flags, canonical order, and the checks.
    pub fn settle(&mut self) -> Result<(), String> {
        if self.all_dims {
            self.dims = TC_HEAD_DIMS.to_vec();
        }
        if self.impls.is_empty() {
            self.impls = IMPLS.iter().map(|i| i.key).collect();
        }
        self.check |= self.check_only;
        self.impls
            .sort_by_key(|k| IMPLS.iter().position(|i| i.key == *k));
        self.impls.dedup();
        for v in [&mut self.dims, &mut self.seqlens] {
            v.sort();
            v.dedup();
        }
        self.dtypes.sort();
        self.dtypes.dedup();
        for &d in &self.dims {
            if !TC_HEAD_DIMS.contains(&d) {
                return Err(format!(
                    "--dims: {d} is not a tensor-core head dim ({TC_HEAD_DIMS:?})"
                ));
            }
            if d > self.hidden {
                return Err(format!(
                    "--dims: {d} is larger than --hidden {}",
                    self.hidden
                ));
            }
        }
        for &n in &self.seqlens {
            if n == 0 || !self.tokens.is_multiple_of(n) {
                return Err(format!(
                    "--seqlens: {n} does not divide --tokens {}",
                    self.tokens
                ));
            }
        }
        if self.reps == 0 || self.warmup == 0 || self.sets == 0 {
            return Err("--reps, --warmup and --sets must be >= 1".into());
        }
        if self.dtypes.is_empty() || self.dims.is_empty() || self.seqlens.is_empty() {
            return Err("empty --dtypes, --dims or --seqlens".into());
        }
        Ok(())
    }

    /// The timing parameters of the shared loop.
    pub fn timing(&self) -> flash_attn_tests::bench::Timing {
        flash_attn_tests::bench::Timing {
            warmup: self.warmup,
            reps: self.reps,
            budget_s: self.budget_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Opts, String> {
        let mut o = Opts::try_parse_from(std::iter::once("fa-bench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        o.settle()?;
        Ok(o)
    }

    #[test]
    fn defaults_are_the_old_parser_s() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.dtypes, [Dtype::F16, Dtype::Bf16]);
        assert_eq!(
            (o.dims.as_slice(), o.seqlens.len(), o.causal.values()),
            (&[64, 128][..], 6, vec![false, true])
        );
        assert_eq!(o.impls.len(), IMPLS.len());
        assert!(o.torch && !o.check && !o.check_only);
        assert_eq!(
            (
                o.tokens,
                o.hidden,
                o.warmup,
                o.reps,
                o.sets,
                o.fa1_max_seqlen,
                o.seed
            ),
            (16384, 2048, 3, 30, 3, 8192, 1)
        );
        assert_eq!(
            (o.budget_s, o.mem_cap_gb, o.python.as_str()),
            (5.0, 40.0, "python3")
        );
        assert_eq!(o.out, PathBuf::from("bench-out"));
    }

    #[test]
    fn the_documented_invocations_parse() {
        let o = parse(&[
            "--impls",
            "torch-cudnn,fa2,hopper,torch-flash",
            "--dims",
            "256,64,128",
            "--seqlens",
            "4096,16384",
            "--check",
        ])
        .unwrap();
        assert_eq!(o.impls, ["fa2", "hopper", "torch-flash", "torch-cudnn"]);
        assert_eq!(
            (o.dims.as_slice(), o.seqlens.as_slice(), o.check),
            (&[64, 128, 256][..], &[4096, 16384][..], true)
        );
        let o = parse(&[
            "--impls=hopper",
            "--no-torch",
            "--check-only",
            "--causal",
            "yes",
            "--dtypes",
            "fp16",
            "--out=x",
        ])
        .unwrap();
        assert_eq!(
            (o.impls.as_slice(), o.torch, o.check, o.causal.values()),
            (&["hopper"][..], false, true, vec![true])
        );
        assert_eq!(
            (o.dtypes.as_slice(), o.out),
            (&[Dtype::F16][..], PathBuf::from("x"))
        );
        assert_eq!(
            parse(&["--causal", "0"]).unwrap().causal.values(),
            vec![false]
        );
        // Last one wins, as before.
        assert_eq!(
            parse(&["--dims", "32", "--all-dims"]).unwrap().dims,
            TC_HEAD_DIMS.to_vec()
        );
        assert_eq!(parse(&["--all-dims", "--dims", "32"]).unwrap().dims, [32]);
        assert_eq!(parse(&["--dims", "32", "--dims", "96"]).unwrap().dims, [96]);
    }

    #[test]
    fn bad_values_are_refused() {
        for args in [
            &["--dims", "48"][..],
            &["--seqlens", "1000"],
            &["--impls", "fa3"],
            &["--dtypes", "f32"],
            &["--reps", "0"],
            &["--causal", "maybe"],
            &["--bogus"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }
}
