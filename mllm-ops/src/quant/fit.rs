//! Least-squares scale searches used by the K-quant quantizers.
//!
//! Each search tries a small grid of candidate inverse scales around the one
//! that maps the extreme value onto the end of the integer range, rounds the
//! values with each, solves the least-squares problem for the scale (and
//! offset) given those integers, and keeps the candidate with the smallest
//! squared error.

/// Candidate steps on each side of the nominal inverse scale.
const STEPS: i32 = 5;
/// Relative size of one step, in units of the integer range.
const STEP: f32 = 0.2;

/// `x` rounded to the nearest integer, ties away from zero, for `|x| < 2²²`
/// (the searches' values are at most about 64): a truncating conversion
/// instead of a `roundf` call, which dominates the searches otherwise.
#[inline(always)]
fn round(x: f32) -> f32 {
    let r = (x.abs() + 0.5) as i32 as f32;
    r.copysign(x)
}

/// Fits `x ≈ s·q − m` with integers `q ∈ 0..=qmax`, `s ≥ 0` and `m ≥ 0`,
/// minimising `Σ (s·q − m − x)²`. Returns `(s, m)`.
pub(crate) fn fit_affine(x: &[f32], qmax: u8) -> (f32, f32) {
    let lo = x.iter().fold(0.0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::MIN, |a, &v| a.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let qmax_f = qmax as f32;
    let n = x.len() as f32;
    let sx: f32 = x.iter().sum();
    let sxx: f32 = x.iter().map(|v| v * v).sum();
    // The plain min/max fit, kept if no candidate is better.
    let mut best = ((hi - lo) / qmax_f, -lo);
    let mut best_err = f32::INFINITY;
    for step in -STEPS..=STEPS {
        let iscale = (qmax_f + STEP * step as f32) / (hi - lo);
        let (mut sq, mut sqq, mut sqx) = (0.0f32, 0.0f32, 0.0f32);
        for &v in x {
            let q = round((v - lo) * iscale).clamp(0.0, qmax_f);
            sq += q;
            sqq += q * q;
            sqx += q * v;
        }
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            continue;
        }
        let mut s = (n * sqx - sq * sx) / det;
        let mut off = (sqq * sx - sq * sqx) / det;
        if off > 0.0 {
            off = 0.0;
            s = sqx / sqq;
        }
        if s <= 0.0 {
            continue;
        }
        // Σ (s·q + off − x)² expanded in the sums above.
        let err =
            s * s * sqq + 2.0 * s * off * sq - 2.0 * s * sqx + n * off * off - 2.0 * off * sx + sxx;
        if err < best_err {
            best_err = err;
            best = (s, -off);
        }
    }
    best
}

/// Fits `x ≈ s·q` with integers `q ∈ −32..=31` (the largest magnitude may
/// map to either end, so `s` may be negative), minimising `Σ (s·q − x)²`.
pub(crate) fn fit_symmetric6(x: &[f32]) -> f32 {
    fit_symmetric(x, 32)
}

/// Fits `x ≈ s·q` with integers `q ∈ −half..=half − 1` (the largest
/// magnitude may map to either end, so `s` may be negative), minimising
/// `Σ (s·q − x)²`.
pub(crate) fn fit_symmetric(x: &[f32], half: i32) -> f32 {
    let vmax = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if vmax == 0.0 {
        return 0.0;
    }
    let (lo, hi) = (-half as f32, (half - 1) as f32);
    let mut best_s = -vmax / half as f32;
    let mut best_gain = 0.0f32;
    for step in -STEPS..=STEPS {
        let k = half as f32 + STEP * step as f32;
        for iscale in [-k / vmax, (k - 1.0) / vmax] {
            let (mut sqq, mut sqx) = (0.0f32, 0.0f32);
            for &v in x {
                let q = round(v * iscale).clamp(lo, hi);
                sqq += q * q;
                sqx += q * v;
            }
            // The error is Σx² − (Σqx)² / Σq²: maximise the second term.
            if sqq > 0.0 && sqx * sqx / sqq > best_gain {
                best_gain = sqx * sqx / sqq;
                best_s = sqx / sqq;
            }
        }
    }
    best_s
}

/// The index of the value of the ascending `grid` nearest to `v`.
#[inline]
pub(crate) fn nearest(grid: &[f32], v: f32) -> usize {
    let above = grid.partition_point(|&g| g < v);
    match above {
        0 => 0,
        n if n == grid.len() => n - 1,
        n if v - grid[n - 1] <= grid[n] - v => n - 1,
        n => n,
    }
}

/// Fits `x ≈ s·g` with each `g` a value of the ascending, non-linear `grid`
/// (both signs), minimising `Σ (s·g − x)²`: candidate scales map the
/// largest magnitude onto either end of the grid, each candidate's nearest
/// grid values give a least-squares scale, and the best of those is kept.
pub(crate) fn fit_grid(x: &[f32], grid: &[f32]) -> f32 {
    let vmax = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if vmax == 0.0 {
        return 0.0;
    }
    let (first, last) = (grid[0], grid[grid.len() - 1]);
    let mut best_s = vmax / first;
    let mut best_gain = 0.0f32;
    for step in -STEPS..=STEPS {
        let shift = STEP * 5.0 * step as f32;
        for end in [first + shift, last + shift] {
            let s = vmax / end;
            let (mut sgg, mut sgx) = (0.0f32, 0.0f32);
            for &v in x {
                let g = grid[nearest(grid, v / s)];
                sgg += g * g;
                sgx += g * v;
            }
            if sgg > 0.0 && sgx * sgx / sgg > best_gain {
                best_gain = sgx * sgx / sgg;
                best_s = sgx / sgg;
            }
        }
    }
    best_s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_round_matches_round() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0625 + 0.03125 * (i % 3) as f32;
            assert_eq!(round(x), x.round(), "{x}");
        }
        assert_eq!(round(2.5), 3.0);
        assert_eq!(round(-2.5), -3.0);
        assert_eq!(round(-0.2), -0.0);
    }

    #[test]
    fn affine_fit_is_exact_on_a_grid() {
        let x: Vec<f32> = (0..32).map(|i| 0.25 * (i % 16) as f32 - 1.0).collect();
        let (s, m) = fit_affine(&x, 15);
        assert!((s - 0.25).abs() < 1e-6 && (m - 1.0).abs() < 1e-6, "{s} {m}");
    }

    #[test]
    fn affine_fit_beats_min_max() {
        let x: Vec<f32> = (0..32).map(|i| ((i * 37 % 29) as f32).sqrt()).collect();
        let err = |s: f32, m: f32| -> f32 {
            x.iter()
                .map(|&v| {
                    let q = ((v + m) / s).round().clamp(0.0, 15.0);
                    (s * q - m - v).powi(2)
                })
                .sum()
        };
        let (s, m) = fit_affine(&x, 15);
        let hi = x.iter().fold(0.0f32, |a, &v| a.max(v));
        assert!(err(s, m) <= err(hi / 15.0, 0.0) + 1e-6);
    }

    #[test]
    fn symmetric_fit_is_exact_on_a_grid() {
        let x: Vec<f32> = (0..16).map(|i| 0.5 * (i as f32 - 8.0)).collect();
        let s = fit_symmetric6(&x);
        for &v in &x {
            let q = (v / s).round();
            assert!((q * s - v).abs() < 1e-5, "{s}");
        }
        assert_eq!(fit_symmetric6(&[0.0; 16]), 0.0);
        let x: Vec<f32> = (0..16).map(|i| 0.5 * (i % 8) as f32 - 2.0).collect();
        let s = fit_symmetric(&x, 4);
        assert!((s - 0.5).abs() < 1e-6 || (s + 0.5).abs() < 1e-6, "{s}");
    }

    #[test]
    fn nearest_grid_values() {
        let grid = [-3.0, -1.0, 0.5, 2.0];
        let got: Vec<usize> = [-9.0, -2.0, -1.9, 0.0, -0.25, 1.25, 1.3, 7.0]
            .map(|v| nearest(&grid, v))
            .to_vec();
        assert_eq!(got, [0, 0, 1, 2, 1, 2, 3, 3]);
    }

    #[test]
    fn grid_fit_is_exact_on_a_scaled_grid() {
        let grid = [-127.0, -83.0, -35.0, 1.0, 25.0, 69.0, 113.0];
        let x: Vec<f32> = (0..32).map(|i| 0.01 * grid[i % 7]).collect();
        let s = fit_grid(&x, &grid);
        assert!((s - 0.01).abs() < 1e-7, "{s}");
        assert_eq!(fit_grid(&[0.0; 32], &grid), 0.0);
    }
}
