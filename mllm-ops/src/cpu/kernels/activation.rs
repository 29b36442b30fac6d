//! Activation functions and gated (GLU) activations, out of place.

/// `sqrt(2 / π)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `x · sigmoid(x)` for one value.
#[inline]
fn silu1(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))` for one value.
#[inline]
fn gelu_tanh1(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// Complementary error function in f64, with relative error below 1.2e-7
/// everywhere (Chebyshev fit, Numerical Recipes `erfcc`).
#[inline]
fn erfc64(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// `0.5 x (1 + erf(x / √2))` for one value, written as `0.5 x erfc(-x/√2)`
/// so that it stays accurate for large negative `x`.
#[inline]
fn gelu1(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * erfc64(-x * std::f64::consts::FRAC_1_SQRT_2)) as f32
}

/// The error function, `|error| < 3e-7` (f64 approximation rounded to f32).
pub fn erf(x: f32) -> f32 {
    (1.0 - erfc64(x as f64)) as f32
}

/// SiLU / swish: `out[i] = x[i] · sigmoid(x[i])`.
pub fn silu(x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX2, FMA and AVX-512F were detected just above.
        unsafe { avx512::swiglu(x, None, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA were detected just above.
        unsafe { avx2::swiglu(x, None, out) };
        return;
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = silu1(v);
    }
}

/// Tanh-approximated GELU (`gelu_new`, `gelu_pytorch_tanh`):
/// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_tanh1(v);
    }
}

/// Exact (erf) GELU: `0.5 x (1 + erf(x / √2))`, absolute error below 1e-6
/// relative to `max(1, |x|)`.
pub fn gelu(x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu1(v);
    }
}

/// ReLU: `out[i] = max(x[i], 0)`.
pub fn relu(x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        *o = if v > 0.0 { v } else { 0.0 };
    }
}

/// SwiGLU: `out[i] = silu(gate[i]) · up[i]`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    debug_assert_eq!(gate.len(), up.len());
    debug_assert_eq!(gate.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX2, FMA and AVX-512F were detected just above.
        unsafe { avx512::swiglu(gate, Some(up), out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 and FMA were detected just above.
        unsafe { avx2::swiglu(gate, Some(up), out) };
        return;
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu1(g) * u;
    }
}

/// The gated activation `out = act(gate) · up` of `act` (SwiGLU, GeGLU
/// or ReGLU), each value as the op over a whole tensor gives it.
pub fn glu(act: mllm_core::op::Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    use mllm_core::op::Activation;
    match act {
        Activation::Silu => swiglu(gate, up, out),
        Activation::GeluTanh => geglu_tanh(gate, up, out),
        Activation::Gelu => geglu(gate, up, out),
        Activation::Relu => reglu(gate, up, out),
    }
}

/// SiLU and SwiGLU 8 lanes at a time (within 2e-7 relative of the scalar
/// forms), the tail in scalar code.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::silu1;
    use crate::cpu::kernels::simd::avx2::{load, store};
    use crate::cpu::kernels::simd::vmath::silu8;

    /// Whether this CPU runs [`swiglu`].
    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// `out = silu(gate) · up`, or `silu(gate)` without `up`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn swiglu(gate: &[f32], up: Option<&[f32]>, out: &mut [f32]) {
        let n = out.len().min(gate.len()) / 8 * 8;
        for i in (0..n).step_by(8) {
            let mut v = silu8(load(&gate[i..]));
            if let Some(up) = up {
                v = _mm256_mul_ps(v, load(&up[i..]));
            }
            store(&mut out[i..], v);
        }
        for i in n..out.len() {
            out[i] = silu1(gate[i]) * up.map_or(1.0, |u| u[i]);
        }
    }
}

/// SiLU and SwiGLU 16 lanes at a time, the rest (under 16 values) by
/// [`avx2::swiglu`]: every value gets the bits the AVX2 kernel gives it.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use crate::cpu::kernels::simd::avx512::{load, store, LANES};
    use crate::cpu::kernels::simd::vmath::silu16;

    /// Whether this CPU runs [`swiglu`].
    pub(super) fn available() -> bool {
        super::avx2::available() && is_x86_feature_detected!("avx512f")
    }

    /// `out = silu(gate) · up`, or `silu(gate)` without `up`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) fn swiglu(gate: &[f32], up: Option<&[f32]>, out: &mut [f32]) {
        let n = out.len().min(gate.len()) / LANES * LANES;
        for i in (0..n).step_by(LANES) {
            let mut v = silu16(load(&gate[i..]));
            if let Some(up) = up {
                v = _mm512_mul_ps(v, load(&up[i..]));
            }
            store(&mut out[i..], v);
        }
        super::avx2::swiglu(&gate[n..], up.map(|u| &u[n..]), &mut out[n..]);
    }
}

/// ReGLU: `out[i] = max(gate[i], 0) · up[i]`.
pub fn reglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    debug_assert_eq!(gate.len(), up.len());
    debug_assert_eq!(gate.len(), out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = if g > 0.0 { g * u } else { 0.0 };
    }
}

/// GeGLU with the tanh GELU: `out[i] = gelu_tanh(gate[i]) · up[i]`.
pub fn geglu_tanh(gate: &[f32], up: &[f32], out: &mut [f32]) {
    debug_assert_eq!(gate.len(), up.len());
    debug_assert_eq!(gate.len(), out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh1(g) * u;
    }
}

/// GeGLU with the exact GELU: `out[i] = gelu(gate[i]) · up[i]`.
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    debug_assert_eq!(gate.len(), up.len());
    debug_assert_eq!(gate.len(), out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu1(g) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{assert_close, Rng};

    // Tolerance for all tests here: |got - want| <= 1e-6 + 1e-5 |want|.
    const ATOL: f64 = 1e-6;
    const RTOL: f64 = 1e-5;

    /// Reference erf in f64: Maclaurin series for |z| <= 2.5, continued
    /// fraction for erfc beyond.
    fn erf_ref(z: f64) -> f64 {
        if z.abs() <= 2.5 {
            let mut term = z;
            let mut sum = z;
            for n in 1..200 {
                term *= -z * z / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let a = z.abs();
            let mut f = a;
            for k in (1..=400).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            let erfc = (-a * a).exp() / (std::f64::consts::PI.sqrt() * f);
            z.signum() * (1.0 - erfc)
        }
    }

    /// Reference `0.5 z (1 + erf(z/√2))`, using erfc directly for z < -3.5.
    fn gelu_ref(x: f64) -> f64 {
        let z = x / std::f64::consts::SQRT_2;
        if z < -2.5 {
            let a = -z;
            let mut f = a;
            for k in (1..=400).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            0.5 * x * (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
        } else {
            0.5 * x * (1.0 + erf_ref(z))
        }
    }

    fn inputs() -> Vec<f32> {
        let mut rng = Rng::new(51);
        let mut x = rng.vec(1001, 8.0);
        x.extend([
            0.0, -0.0, 1e-8, -1e-8, 20.0, -20.0, 88.0, -88.0, 100.0, -100.0,
        ]);
        x
    }

    #[test]
    fn erf_accuracy() {
        for &x in &inputs() {
            let want = erf_ref(x as f64);
            assert!((erf(x) as f64 - want).abs() < 1e-6, "erf({x})");
        }
    }

    #[test]
    fn unary_activations_match_reference() {
        let x = inputs();
        let mut out = vec![f32::NAN; x.len()];
        let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();

        silu(&x, &mut out);
        let want: Vec<f64> = xd.iter().map(|&v| v / (1.0 + (-v).exp())).collect();
        assert_close(&out, &want, ATOL, RTOL);

        gelu_tanh(&x, &mut out);
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let want: Vec<f64> = xd
            .iter()
            .map(|&v| 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh()))
            .collect();
        assert_close(&out, &want, ATOL, RTOL);

        gelu(&x, &mut out);
        let want: Vec<f64> = xd.iter().map(|&v| gelu_ref(v)).collect();
        assert_close(&out, &want, ATOL, RTOL);

        relu(&x, &mut out);
        let want: Vec<f64> = xd.iter().map(|&v| v.max(0.0)).collect();
        assert_close(&out, &want, 0.0, 0.0);
    }

    /// The 16-lane SiLU and SwiGLU give the 8-lane ones' bits, whole
    /// vectors and tails of every length, at zeros of both signs, large
    /// magnitudes and values where `e^{-|x|}` underflows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_swiglu_equals_avx2_bit_for_bit() {
        if !avx512::available() {
            eprintln!("skipping: no AVX-512F");
            return;
        }
        let mut rng = Rng::new(53);
        let mut g = rng.vec(100, 12.0);
        g[..6].copy_from_slice(&[0.0, -0.0, 95.0, -95.0, 1e-30, -1e-30]);
        let u = rng.vec(100, 2.0);
        for n in [1, 7, 8, 15, 16, 17, 31, 33, 64, 100] {
            for up in [None, Some(&u[..n])] {
                let (mut wide, mut narrow) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                // SAFETY: `available` found AVX2, FMA and AVX-512F.
                unsafe { avx512::swiglu(&g[..n], up, &mut wide) };
                // SAFETY: as above.
                unsafe { avx2::swiglu(&g[..n], up, &mut narrow) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&wide),
                    bits(&narrow),
                    "{n} values, up {}",
                    up.is_some()
                );
            }
        }
    }

    #[test]
    fn gated_activations_match_reference() {
        let mut rng = Rng::new(52);
        for n in [1, 7, 33, 100] {
            let g = rng.vec(n, 6.0);
            let u = rng.vec(n, 2.0);
            let mut out = vec![f32::NAN; n];
            swiglu(&g, &u, &mut out);
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| g as f64 / (1.0 + (-(g as f64)).exp()) * u as f64)
                .collect();
            assert_close(&out, &want, ATOL, RTOL);

            geglu_tanh(&g, &u, &mut out);
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| {
                    let v = g as f64;
                    0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh()) * u as f64
                })
                .collect();
            assert_close(&out, &want, ATOL, RTOL);

            geglu(&g, &u, &mut out);
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| gelu_ref(g as f64) * u as f64)
                .collect();
            assert_close(&out, &want, ATOL, RTOL);

            reglu(&g, &u, &mut out);
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| (g as f64).max(0.0) * u as f64)
                .collect();
            assert_close(&out, &want, ATOL, RTOL);
        }
    }
}
