//! `candle-flash-attn` 0.11.1's API on flash-attn's pure-Rust kernels: a
//! re-export of [`flash_attn_candle`]'s drop-in functions. Use it with
//!
//! ```toml
//! [patch.crates-io]
//! candle-flash-attn = { path = "path/to/flash-attn-rs/candle-crate/candle-flash-attn" }
//! ```
pub use flash_attn_candle::*;
