//! The checks of the decode calls, before anything is enqueued: a cache's
//! layout against its buffers and the call ([`CacheGeom`]), the new rows
//! to append, q's and O's alignment, the streams. Typed errors name the
//! argument and the value.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};
use flash_attn_common::AttnParams;

use super::args::{BlockTable, CallerOut, NewRows};
use crate::device::FlashAttention;
use crate::error::{FlashAttnError, Result};
use crate::tensor::{Tensor, TensorLayout};
use crate::validate::{AXES, MAX_DIM, PAGE_AXES, check_layout, check_layout_axes, check_tc_alignment};

pub(super) fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument {
        argument,
        value,
        reason,
    }
}

/// What the host knows of a cache.
#[derive(Clone, Copy)]
pub(super) struct CacheGeom {
    /// `batch_c` (contiguous) or `num_pages` (paged).
    pub(super) n_rows: usize,
    /// `seqlen_cache` or `page_size`.
    pub(super) rows_per: usize,
    pub(super) nheads_k: usize,
    /// Keys one sequence can hold.
    pub(super) capacity: usize,
    pub(super) paged: bool,
}

/// Validates a cache's layout against its buffers and the call (`batch`
/// sequences of head dim `d`).
pub(super) fn check_cache(
    names: (&'static str, &'static str),
    layout: &TensorLayout,
    lens: (usize, usize),
    d: usize,
    batch: usize,
    cache_batch_idx: Option<usize>,
    block_table: Option<&BlockTable<'_>>,
) -> Result<CacheGeom> {
    let [n_rows, rows_per, nheads_k, dk] = layout.shape;
    // A paged cache's axes by their own names (a page size of 0 is no seqlen).
    let axes = if block_table.is_some() { PAGE_AXES } else { AXES };
    check_layout_axes(names.0, axes, layout, lens.0)?;
    check_layout_axes(names.1, axes, layout, lens.1)?;
    if dk != d {
        return Err(FlashAttnError::ShapeMismatch { argument: names.0, axis: "headdim", actual: dk, expected: d, rule: "same as q" });
    }
    if let Some(n) = cache_batch_idx {
        if block_table.is_some() {
            return Err(invalid("cache_batch_idx", "given".into(), "applies to contiguous caches; a paged cache has a block table"));
        }
        if n != batch {
            return Err(invalid("cache_batch_idx", format!("length {n}"), "must hold one i32 per sequence (q's batch)"));
        }
    } else if block_table.is_none() && n_rows < batch {
        return Err(invalid(names.0, format!("batch_c = {n_rows}, batch = {batch}"), "needs a cache row per sequence (or cache_batch_idx)"));
    }
    let capacity = match block_table {
        Some(bt) => {
            if bt.max_blocks_per_seq == 0 {
                return Err(invalid("block_table", "max_blocks_per_seq = 0".into(), "a block table row holds at least one page"));
            }
            if bt.table.len() < batch * bt.max_blocks_per_seq {
                return Err(invalid("block_table", format!("length {}", bt.table.len()), "must hold batch · max_blocks_per_seq i32"));
            }
            bt.max_blocks_per_seq.checked_mul(rows_per).filter(|&c| c <= MAX_DIM).ok_or_else(|| {
                invalid("block_table", format!("{} blocks of {rows_per}", bt.max_blocks_per_seq), "capacity exceeds 2³¹ − 1 keys")
            })?
        }
        None => rows_per,
    };
    Ok(CacheGeom { n_rows, rows_per, nheads_k, capacity, paged: block_table.is_some() })
}

/// Validates new keys (or values) `(batch, s_new, nheads_k, d)` to append;
/// returns `s_new`.
pub(super) fn check_new<T>(name: &'static str, new: &Tensor<'_, dyn DevicePtr<T> + '_>, batch: usize, geom: &CacheGeom, d: usize) -> Result<usize> {
    check_layout(name, &new.layout, new.data.len())?;
    let [b2, s_new, h2, d2] = new.layout.shape;
    if (b2, h2, d2) != (batch, geom.nheads_k, d) {
        return Err(invalid(name, format!("shape {:?}", new.layout.shape), "must be (batch, s_new, nheads_k, headdim)"));
    }
    if s_new > geom.capacity {
        return Err(invalid(name, format!("s_new = {s_new}, capacity = {}", geom.capacity), "more rows than a sequence's cache holds"));
    }
    Ok(s_new)
}

/// Validates the new keys and values of a call, which come together;
/// returns them (or `None`).
pub(super) fn check_new_pair<'a, T>(k_new: Option<NewRows<'a, T>>, v_new: Option<NewRows<'a, T>>, batch: usize, geom: &CacheGeom, d: usize) -> Result<Option<(NewRows<'a, T>, NewRows<'a, T>)>> {
    match (k_new, v_new) {
        (None, None) => Ok(None),
        (Some(kn), Some(vn)) => {
            if kn.layout.shape != vn.layout.shape {
                return Err(invalid("v_new", format!("shape {:?}", vn.layout.shape), "must have k_new's shape"));
            }
            check_new("k_new", &kn, batch, geom, d)?;
            check_new("v_new", &vn, batch, geom, d)?;
            Ok(Some((kn, vn)))
        }
        (Some(_), None) => Err(invalid("v_new", "None".into(), "new keys and values must be given together")),
        (None, Some(_)) => Err(invalid("k_new", "None".into(), "new keys and values must be given together")),
    }
}

/// q's and a caller's O's 16-byte alignment, checked before an append
/// touches the cache (the attention launch checks every pointer after it).
pub(super) fn check_q_o_alignment<T, Q: DevicePtr<T> + ?Sized>(stream: &Arc<CudaStream>, q: &Q, out: Option<&mut CallerOut<'_, T>>, params: &AttnParams) -> Result<()> {
    let (q_ptr, _gq) = q.device_ptr(stream);
    let o_ptr = match out {
        Some(c) => c.o.device_ptr_mut(stream).0,
        None => 0,
    };
    check_tc_alignment(&AttnParams { q_ptr, o_ptr, ..*params })
}

impl FlashAttention {
    /// The streams of a KV-cache call: `stream` and the `inputs`' (named)
    /// on this context, and the caller's O and LSE when given.
    pub(super) fn check_streams<T>(&self, stream: &CudaStream, inputs: &[(&'static str, &CudaStream)], out: Option<&CallerOut<'_, T>>) -> Result<()> {
        for &(name, s) in inputs.iter().chain([("stream", stream)].iter()) {
            self.check_stream(name, s)?;
        }
        match out {
            Some(c) => {
                self.check_stream("o", c.o.stream())?;
                self.check_stream("lse", c.lse.stream())
            }
            None => Ok(()),
        }
    }
}
