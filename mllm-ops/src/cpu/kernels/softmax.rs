//! Row-wise softmax.

/// Numerically stable softmax, in place, over each row of length `n` of `x`
/// (`x.len()` a multiple of `n`): `x = exp(x - max) / Σ exp(x - max)`.
///
/// A row whose entries are all `-inf` (fully masked) becomes all zeros
/// instead of NaN.
pub fn softmax_rows(x: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    debug_assert!(x.len().is_multiple_of(n), "x.len() must be a multiple of n");
    for row in x.chunks_exact_mut(n) {
        softmax_in_place(row);
    }
}

/// Softmax of one row, in place (shared with attention).
#[inline]
pub(crate) fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{assert_close, Rng};

    #[test]
    fn softmax_matches_reference() {
        let mut rng = Rng::new(31);
        for &rows in &[1, 3, 5] {
            for &n in &[1, 7, 33, 100] {
                // Large logits exercise the max subtraction.
                let x = rng.vec(rows * n, 30.0);
                let mut got = x.clone();
                softmax_rows(&mut got, n);
                let mut want = vec![0.0f64; rows * n];
                for t in 0..rows {
                    let r = &x[t * n..(t + 1) * n];
                    let m = r.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
                    let s: f64 = r.iter().map(|&v| (v as f64 - m).exp()).sum();
                    for j in 0..n {
                        want[t * n + j] = (r[j] as f64 - m).exp() / s;
                    }
                }
                // |got - want| <= 1e-6 + 1e-5 |want|.
                assert_close(&got, &want, 1e-6, 1e-5);
            }
        }
    }

    #[test]
    fn softmax_masked_rows() {
        let mut x = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY];
        softmax_rows(&mut x, 2);
        assert_eq!(x, [0.0, 1.0, 0.0, 0.0]);
        softmax_rows(&mut [], 0);
    }
}
