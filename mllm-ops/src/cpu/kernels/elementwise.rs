//! Element-wise binary ops.

/// `out[i] = a[i] + b[i]` (all three slices equally long).
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    debug_assert_eq!(a.len(), b.len());
    debug_assert_eq!(a.len(), out.len());
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// `out[i] = a[i] * b[i]` (all three slices equally long).
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) {
    debug_assert_eq!(a.len(), b.len());
    debug_assert_eq!(a.len(), out.len());
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
}

/// `out[i] = x[i] * factor` (both slices equally long).
pub fn scale(x: &[f32], factor: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * factor;
    }
}

/// `a[i] += b[i]` in place (e.g. a residual connection).
pub fn add_assign(a: &mut [f32], b: &[f32]) {
    debug_assert_eq!(a.len(), b.len());
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// `a[i] *= b[i]` in place.
pub fn mul_assign(a: &mut [f32], b: &[f32]) {
    debug_assert_eq!(a.len(), b.len());
    for (x, &y) in a.iter_mut().zip(b) {
        *x *= y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::Rng;

    #[test]
    fn binary_ops_are_exact() {
        let mut rng = Rng::new(41);
        for n in [0, 1, 7, 33, 100] {
            let a = rng.vec(n, 1.0);
            let b = rng.vec(n, 1.0);
            let mut out = vec![f32::NAN; n];
            // f32 add/mul are correctly rounded: compare bit-exactly with the
            // f64 result rounded to f32.
            add(&a, &b, &mut out);
            for i in 0..n {
                assert_eq!(out[i], (a[i] as f64 + b[i] as f64) as f32);
            }
            mul(&a, &b, &mut out);
            for i in 0..n {
                assert_eq!(out[i], (a[i] as f64 * b[i] as f64) as f32);
            }
            let mut c = a.clone();
            add_assign(&mut c, &b);
            for i in 0..n {
                assert_eq!(c[i], (a[i] as f64 + b[i] as f64) as f32);
            }
            scale(&a, 0.37, &mut out);
            for i in 0..n {
                assert_eq!(out[i], (a[i] as f64 * 0.37f32 as f64) as f32);
            }
            let mut c = a.clone();
            mul_assign(&mut c, &b);
            for i in 0..n {
                assert_eq!(c[i], (a[i] as f64 * b[i] as f64) as f32);
            }
        }
    }
}
