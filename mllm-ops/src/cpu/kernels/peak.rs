//! The arithmetic peak of one core: long runs of independent multiply-adds
//! with no memory traffic, the ceiling that prefill (compute-bound) is
//! measured against, as `examples/membw` is the ceiling of decode.
//!
//! Two kinds, each at a [`SimdLevel`]: f32 fused multiply-adds (what the
//! f16/bf16 and f32 kernels run) and byte multiply-adds (unsigned × signed
//! bytes summed into 32-bit lanes: `vpdpbusd` with AVX-512 VNNI, the
//! `maddubs` + `madd` + `add` sequence with AVX2, full-size `tdpbssd` tile
//! products at the AMX level; what the integer kernels run). Every run adds
//! `1 × 1` per multiply-add into [`CHAINS`] independent accumulators
//! (enough to hide the latency of two pipes; four tiles of sums at the AMX
//! level), so the sum of all lanes equals the count of multiply-adds
//! exactly, which the tests check at every level.

use super::qkernel::{QuantPath, SimdLevel};
#[cfg(target_arch = "x86_64")]
use super::simd;

/// Independent accumulators per run.
pub const CHAINS: usize = 12;

/// Most iterations per run: the f32 lanes then stay exact integers.
pub const MAX_ITERS: usize = 1 << 20;

/// One timed unit of work: what it did and the sum of its accumulators.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakRun {
    /// Multiply-adds performed (f32 lanes or byte products).
    pub multiply_adds: u64,
    /// Sum of every accumulator lane: equals `multiply_adds`.
    pub checksum: f64,
}

/// The kind of multiply-add to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakKind {
    /// f32 fused multiply-adds.
    F32Fma,
    /// Unsigned × signed byte products summed into 32-bit lanes.
    ByteDot,
}

/// Runs `iters` (at most [`MAX_ITERS`]) rounds of [`CHAINS`] vector
/// multiply-adds of `kind` at `level` (of four tile products at the AMX
/// level), or `None` when this CPU lacks the
/// level (the byte kind at [`SimdLevel::Avx512`] needs AVX-512 VNNI; the
/// f32 kind has no [`SimdLevel::AvxVnni`] or [`SimdLevel::Amx`] level,
/// integer-only ones) or
/// the level is not measured: NEON, and the portable level, whose loops
/// the compiler folds or vectorises as it likes.
pub fn run(kind: PeakKind, level: SimdLevel, iters: usize) -> Option<PeakRun> {
    let iters = iters.min(MAX_ITERS);
    let path = match kind {
        PeakKind::F32Fma => QuantPath::F32Activations,
        PeakKind::ByteDot => QuantPath::Int16Activations,
    };
    if !level.is_available(path) {
        return None;
    }
    let (per_round, checksum) = per_round_and_checksum(kind, level, iters)?;
    Some(PeakRun {
        multiply_adds: (per_round * iters) as u64,
        checksum,
    })
}

/// The multiply-adds of one round of `kind` at `level` ([`CHAINS`] vector
/// multiply-adds; at the AMX level, `simd::amx::PEAK_CHAINS` tile
/// products), and the sum of `iters` rounds of them; `level` must be
/// available.
#[cfg(target_arch = "x86_64")]
fn per_round_and_checksum(kind: PeakKind, level: SimdLevel, iters: usize) -> Option<(usize, f64)> {
    if let (PeakKind::ByteDot, SimdLevel::Amx) = (kind, level) {
        use simd::amx::{byte_dot_peak, PEAK_CHAINS, PEAK_PRODUCTS};
        // SAFETY: the caller checked that the AMX level is available: AMX
        // tiles this process may use.
        return Some((PEAK_PRODUCTS * PEAK_CHAINS, unsafe { byte_dot_peak(iters) }));
    }
    let (lanes, checksum) = lanes_and_checksum(kind, level, iters)?;
    Some((lanes * CHAINS, checksum))
}

/// The lanes of one vector multiply-add of `kind` at `level`, and the sum
/// of `iters` rounds of them; `level` must be available.
#[cfg(target_arch = "x86_64")]
fn lanes_and_checksum(kind: PeakKind, level: SimdLevel, iters: usize) -> Option<(usize, f64)> {
    Some(match (kind, level) {
        (PeakKind::F32Fma, SimdLevel::Avx2) => {
            // SAFETY: the caller checked that AVX2 and FMA are available.
            (8, unsafe { simd::peak::fma_avx2(iters) })
        }
        (PeakKind::F32Fma, SimdLevel::Avx512) => {
            // SAFETY: the caller checked that AVX-512F and FMA are available.
            (16, unsafe { simd::peak::fma_avx512(iters) })
        }
        (PeakKind::ByteDot, SimdLevel::Avx2) => {
            // SAFETY: the caller checked that AVX2 is available.
            (32, unsafe { simd::peak::byte_dot_avx2(iters) })
        }
        (PeakKind::ByteDot, SimdLevel::AvxVnni) => {
            // SAFETY: the caller checked that AVX2 and AVX-VNNI are
            // available.
            (32, unsafe { simd::peak::byte_dot_avx_vnni(iters) })
        }
        (PeakKind::ByteDot, SimdLevel::Avx512) => {
            // SAFETY: the caller checked that AVX-512F/BW/VL and VNNI are
            // available.
            (64, unsafe { simd::peak::byte_dot_vnni(iters) })
        }
        _ => return None,
    })
}

/// No level is measured off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn per_round_and_checksum(_: PeakKind, _: SimdLevel, _: usize) -> Option<(usize, f64)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At every level this CPU runs, each kind adds exactly one per
    /// multiply-add it claims, for small and the largest runs.
    #[test]
    fn every_level_counts_its_multiply_adds_exactly() {
        for kind in [PeakKind::F32Fma, PeakKind::ByteDot] {
            for level in SimdLevel::FASTEST_FIRST {
                for iters in [0, 1, 7, MAX_ITERS] {
                    let Some(r) = run(kind, level, iters) else {
                        continue;
                    };
                    let per_round = match (kind, level) {
                        (PeakKind::F32Fma, SimdLevel::Avx2) => 8 * CHAINS,
                        (PeakKind::ByteDot, SimdLevel::Avx2 | SimdLevel::AvxVnni) => 32 * CHAINS,
                        (PeakKind::ByteDot, SimdLevel::Amx) => 4 * 16 * 16 * 64,
                        (PeakKind::F32Fma, _) => 16 * CHAINS,
                        (PeakKind::ByteDot, _) => 64 * CHAINS,
                    };
                    let want = (per_round * iters) as u64;
                    assert_eq!(r.multiply_adds, want, "{kind:?} {level:?} {iters}");
                    assert_eq!(r.checksum, want as f64, "{kind:?} {level:?} {iters}");
                }
            }
        }
    }

    #[test]
    fn runs_are_capped_and_missing_levels_are_none() {
        assert_eq!(run(PeakKind::F32Fma, SimdLevel::Scalar, 1), None);
        assert_eq!(run(PeakKind::ByteDot, SimdLevel::Scalar, 1), None);
        #[cfg(target_arch = "x86_64")]
        if let Some(r) = run(PeakKind::F32Fma, SimdLevel::Avx2, MAX_ITERS + 5) {
            assert_eq!(r.multiply_adds, (8 * CHAINS * MAX_ITERS) as u64);
        }
        #[cfg(not(target_arch = "aarch64"))]
        assert_eq!(run(PeakKind::ByteDot, SimdLevel::Neon, 1), None);
        #[cfg(not(target_arch = "x86_64"))]
        assert_eq!(run(PeakKind::F32Fma, SimdLevel::Avx2, 1), None);
    }
}
