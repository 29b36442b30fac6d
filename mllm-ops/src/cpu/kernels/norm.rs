//! RMSNorm and LayerNorm over the last dimension.

use super::matmul::dot;

/// Sum of a slice in f32 with independent accumulators (vectorises).
#[inline]
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (s, &v) in acc.iter_mut().zip(c) {
            *s += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// RMSNorm of each of the `rows` rows of `x` (`[rows, dim]`):
/// `out = x / sqrt(mean(x²) + eps) * w`, where `w = weight` or, with
/// `unit_offset` (Gemma), `w = 1 + weight`.
///
/// The mean of squares is accumulated in f32, like PyTorch's float32
/// `pow(2).mean(-1)`. `weight` has `dim` elements; `out` is `[rows, dim]`.
pub fn rms_norm(
    x: &[f32],
    rows: usize,
    dim: usize,
    weight: &[f32],
    eps: f32,
    unit_offset: bool,
    out: &mut [f32],
) {
    debug_assert_eq!(x.len(), rows * dim, "x must be [rows, dim]");
    debug_assert_eq!(out.len(), rows * dim, "out must be [rows, dim]");
    debug_assert_eq!(weight.len(), dim, "weight must have dim elements");
    if dim == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ms = dot(xr, xr) / dim as f32;
        let r = 1.0 / (ms + eps).sqrt();
        if unit_offset {
            for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
                *o = (v * r) * (1.0 + w);
            }
        } else {
            for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
                *o = (v * r) * w;
            }
        }
    }
}

/// LayerNorm (as `torch.nn.LayerNorm`) of each of the `rows` rows of `x`
/// (`[rows, dim]`): `out = (x - mean) / sqrt(var + eps) * weight + bias`
/// with the biased variance `mean((x - mean)²)`, computed two-pass in f32.
///
/// `weight` and `bias` (if any) have `dim` elements; `out` is `[rows, dim]`.
pub fn layer_norm(
    x: &[f32],
    rows: usize,
    dim: usize,
    weight: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
) {
    debug_assert_eq!(x.len(), rows * dim, "x must be [rows, dim]");
    debug_assert_eq!(out.len(), rows * dim, "out must be [rows, dim]");
    debug_assert_eq!(weight.len(), dim, "weight must have dim elements");
    if let Some(b) = bias {
        debug_assert_eq!(b.len(), dim, "bias must have dim elements");
    }
    if dim == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean = sum(xr) / dim as f32;
        // Centre into `out` first, then reuse it for the variance.
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = v - mean;
        }
        let var = dot(or, or) / dim as f32;
        let r = 1.0 / (var + eps).sqrt();
        match bias {
            Some(b) => {
                for ((o, &w), &bv) in or.iter_mut().zip(weight).zip(b) {
                    *o = (*o * r) * w + bv;
                }
            }
            None => {
                for (o, &w) in or.iter_mut().zip(weight) {
                    *o = (*o * r) * w;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{assert_close, Rng};

    // Tolerance for all tests here: |got - want| <= 1e-5 + 1e-5 |want|.
    const ATOL: f64 = 1e-5;
    const RTOL: f64 = 1e-5;

    #[test]
    fn rms_norm_matches_reference() {
        let mut rng = Rng::new(11);
        for &rows in &[1, 3, 5] {
            for &dim in &[1, 7, 33, 100] {
                for unit_offset in [false, true] {
                    let x = rng.vec(rows * dim, 2.0);
                    let w = rng.vec(dim, 1.0);
                    let eps = 1e-6f32;
                    let mut out = vec![f32::NAN; rows * dim];
                    rms_norm(&x, rows, dim, &w, eps, unit_offset, &mut out);
                    let mut want = vec![0.0f64; rows * dim];
                    for t in 0..rows {
                        let xr = &x[t * dim..(t + 1) * dim];
                        let ms = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
                        let r = 1.0 / (ms + eps as f64).sqrt();
                        for d in 0..dim {
                            let wd = if unit_offset {
                                1.0 + w[d] as f64
                            } else {
                                w[d] as f64
                            };
                            want[t * dim + d] = xr[d] as f64 * r * wd;
                        }
                    }
                    assert_close(&out, &want, ATOL, RTOL);
                }
            }
        }
    }

    #[test]
    fn layer_norm_matches_reference() {
        let mut rng = Rng::new(12);
        for &rows in &[1, 3, 5] {
            for &dim in &[1, 7, 33, 100] {
                for with_bias in [false, true] {
                    // Offset the inputs so that the mean matters.
                    let x: Vec<f32> = rng.vec(rows * dim, 2.0).iter().map(|v| v + 0.7).collect();
                    let w = rng.vec(dim, 1.0);
                    let b = rng.vec(dim, 1.0);
                    let bias = with_bias.then_some(&b[..]);
                    let eps = 1e-5f32;
                    let mut out = vec![f32::NAN; rows * dim];
                    layer_norm(&x, rows, dim, &w, bias, eps, &mut out);
                    let mut want = vec![0.0f64; rows * dim];
                    for t in 0..rows {
                        let xr: Vec<f64> = x[t * dim..(t + 1) * dim]
                            .iter()
                            .map(|&v| v as f64)
                            .collect();
                        let mean = xr.iter().sum::<f64>() / dim as f64;
                        let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / dim as f64;
                        let r = 1.0 / (var + eps as f64).sqrt();
                        for d in 0..dim {
                            let bd = bias.map_or(0.0, |b| b[d] as f64);
                            want[t * dim + d] = (xr[d] - mean) * r * w[d] as f64 + bd;
                        }
                    }
                    assert_close(&out, &want, ATOL, RTOL);
                }
            }
        }
    }
}
