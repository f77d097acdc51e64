//! The Hopper-native kernels (sm_90a, `kernel-crate/src/hopper/`): their
//! table, the tensor maps they read q, k and v through, the dispatch rule
//! and the launch.
//!
//! Kernel names are `flash_fwd_hopper_{f16,bf16}_d{D}_bc{Bc}[_ov][_pp][_w3]`;
//! `Br = 64` per consumer warpgroup (2, or 3 for `_w3`), one producer
//! warpgroup, 128 threads each. They
//! exist only in the sm_90a PTX, which the library loads on compute
//! capability 9.0 unless [`KernelFamily::MmaSync`] is asked for.
//!
//! Dispatch: f16/bf16, `LoopOrder::Fa2`, no explicit `block`, a head dim
//! that [`hopper_head_dim`] maps to a compiled one (64, 128, 192, 256, or a
//! multiple of 8 in 33..=255 zero-padded to the next of them), on an sm_90a
//! module → the Hopper kernel (varlen or sliding window: its `_vw`
//! variant); everything else (FA1, explicit `(Br, Bc)` choices, softcap,
//! ALiBi, decode, d ≤ 32, other GPUs) keeps the `mma.sync` kernels.

pub(crate) mod fp8;
mod launch;
mod plan;
mod table;

pub(crate) use launch::launch;
pub use launch::{TensorMap, launch_params, launch_with_maps, maps_argument, tensor_maps, tensor_maps_in_global_memory};
pub use fp8::{HOPPER_FP8_KERNELS, HopperFp8Kernel};
pub use plan::plan;
pub use table::{HOPPER_KERNELS, HopperKernel, PROBE_KERNELS, PROBE_SMEM_BYTES, hopper_head_dim};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::{DispatchKey, Plan};
    use crate::types::{DType, Dims, Features};
    use crate::params::LoopOrder;

    #[test]
    fn head_dims_pad_to_the_next_compiled_one() {
        for (d, want) in [(64, Some(64)), (40, Some(64)), (72, Some(128)), (96, Some(128)), (136, Some(192)), (192, Some(192)), (200, Some(256)), (248, Some(256)), (256, Some(256))] {
            assert_eq!(hopper_head_dim(d), want, "d = {d}");
        }
        for d in [0, 8, 32, 44, 100, 264] {
            assert_eq!(hopper_head_dim(d), None, "d = {d}");
        }
        // Every mapped head dim has a dense and a `_vw` kernel in both dtypes.
        for d in (40..=256).step_by(8) {
            let k = hopper_head_dim(d).unwrap();
            for bf16 in [false, true] {
                assert!(HopperKernel::find(bf16, k).is_some() && HopperKernel::find_vw(bf16, k).is_some(), "d = {d} → {k}");
            }
        }
        // The plan: d = 96 runs the d = 128 kernel; d = 32 and softcap stay on mma.sync.
        let key = |headdim, mods| DispatchKey {
            dtype: DType::BF16,
            headdim,
            causal: true,
            loop_order: LoopOrder::Fa2,
            arch: (9, 0),
            features: Features { varlen: false, mods, decode: false },
        };
        let dims = |headdim| Dims { batch: 1, nheads: 2, nheads_k: 2, seqlen_q: 300, seqlen_k: 300, headdim };
        let Ok(Some(Plan::Hopper { kernel, .. })) = plan(true, &key(96, false), false, &dims(96), None, 232_448) else { panic!() };
        assert_eq!((kernel.d, kernel.bf16, kernel.vw), (128, true, false));
        assert!(matches!(plan(true, &key(32, false), false, &dims(32), None, 232_448), Ok(None)));
        assert!(matches!(plan(true, &key(96, true), false, &dims(96), None, 232_448), Ok(None)));
        assert!(matches!(plan(false, &key(96, false), false, &dims(96), None, 232_448), Ok(None)));
    }
}

