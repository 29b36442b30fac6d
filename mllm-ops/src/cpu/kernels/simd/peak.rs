//! The multiply-add loops of `peak` at the x86-64 levels: [`CHAINS`]
//! independent accumulators, each adding `1 × 1` per lane and iteration,
//! summed over every lane at the end.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting the features it names (see `peak::run`).

use std::arch::x86_64::*;

use super::avx2::store;
use crate::cpu::kernels::peak::CHAINS;

/// Sum of the eight lanes of `v` as f64.
#[target_feature(enable = "avx2,fma")]
fn lane_sum(v: __m256) -> f64 {
    let mut lanes = [0.0f32; 8];
    store(&mut lanes, v);
    lanes.iter().map(|&x| x as f64).sum()
}

/// `iters` rounds of [`CHAINS`] 256-bit fused multiply-adds.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn fma_avx2(iters: usize) -> f64 {
    let (a, b) = std::hint::black_box((_mm256_set1_ps(1.0), _mm256_set1_ps(1.0)));
    let mut acc = [_mm256_setzero_ps(); CHAINS];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm256_fmadd_ps(a, b, *c);
        }
    }
    acc.iter().map(|&v| lane_sum(v)).sum()
}

/// `iters` rounds of [`CHAINS`] 512-bit fused multiply-adds.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(crate) fn fma_avx512(iters: usize) -> f64 {
    let (a, b) = std::hint::black_box((_mm512_set1_ps(1.0), _mm512_set1_ps(1.0)));
    let mut acc = [_mm512_setzero_ps(); CHAINS];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm512_fmadd_ps(a, b, *c);
        }
    }
    // Each lane holds at most 2^20, so the 16-lane f32 sums are exact.
    acc.iter().map(|&v| _mm512_reduce_add_ps(v) as f64).sum()
}

/// `iters` rounds of [`CHAINS`] 256-bit byte dot products as the AVX2
/// integer kernels compute them: `vpmaddubsw` (32 byte products into 16-bit
/// pairs), `vpmaddwd` with ones (into 32-bit lanes), `vpaddd`. Written as
/// one `asm!` block per chain: with constant inputs the compiler would
/// otherwise hoist the two products out of the loop and time only the adds.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn byte_dot_avx2(iters: usize) -> f64 {
    let (a, b) = std::hint::black_box((_mm256_set1_epi8(1), _mm256_set1_epi8(1)));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            // SAFETY: register-only AVX2 instructions (no memory, no stack),
            // and AVX2 is enabled for this function.
            unsafe {
                std::arch::asm!(
                    "vpmaddubsw {p}, {a}, {b}",
                    "vpmaddwd {p}, {p}, {ones}",
                    "vpaddd {c}, {c}, {p}",
                    a = in(ymm_reg) a,
                    b = in(ymm_reg) b,
                    ones = in(ymm_reg) ones,
                    p = out(ymm_reg) _,
                    c = inout(ymm_reg) *c,
                    options(nomem, nostack),
                );
            }
        }
    }
    // Each lane holds at most 2^22: exact as f32.
    acc.iter().map(|&v| lane_sum(_mm256_cvtepi32_ps(v))).sum()
}

/// `iters` rounds of [`CHAINS`] 256-bit AVX-VNNI `vpdpbusd` (32 byte
/// products each).
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(crate) fn byte_dot_avx_vnni(iters: usize) -> f64 {
    let (a, b) = std::hint::black_box((_mm256_set1_epi8(1), _mm256_set1_epi8(1)));
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm256_dpbusd_avx_epi32(*c, a, b);
        }
    }
    // Each lane holds at most 2^22: exact as f32.
    acc.iter().map(|&v| lane_sum(_mm256_cvtepi32_ps(v))).sum()
}

/// `iters` rounds of [`CHAINS`] 512-bit `vpdpbusd` (64 byte products
/// each).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn byte_dot_vnni(iters: usize) -> f64 {
    let (a, b) = std::hint::black_box((_mm512_set1_epi8(1), _mm512_set1_epi8(1)));
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm512_dpbusd_epi32(*c, a, b);
        }
    }
    acc.iter().map(|&v| _mm512_reduce_add_epi32(v) as f64).sum()
}
