//! Rotary position embeddings (RoPE).

/// Llama-3 style RoPE frequency scaling (`rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    /// Overall context-extension factor.
    pub factor: f32,
    /// Wavelengths longer than `original_max_position_embeddings /
    /// low_freq_factor` are divided by `factor`.
    pub low_freq_factor: f32,
    /// Wavelengths shorter than `original_max_position_embeddings /
    /// high_freq_factor` are kept unchanged.
    pub high_freq_factor: f32,
    /// The context length the model was originally trained with.
    pub original_max_position_embeddings: f32,
}

/// Inverse frequencies of RoPE: `inv_freq[j] = 1 / theta^(2j / rotary_dim)`
/// for `j in 0..rotary_dim / 2` (computed in f64, rounded to f32), optionally
/// rescaled as Hugging Face transformers' `_compute_llama3_parameters` does
/// (that part in f32, like transformers' float32 tensors).
pub fn rope_inv_freq(rotary_dim: usize, theta: f32, llama3: Option<&Llama3Scaling>) -> Vec<f32> {
    let half = rotary_dim / 2;
    let mut inv: Vec<f32> = (0..half)
        .map(|j| {
            let exponent = (2 * j) as f64 / rotary_dim as f64;
            (1.0 / (theta as f64).powf(exponent)) as f32
        })
        .collect();
    if let Some(s) = llama3 {
        let old_ctx = s.original_max_position_embeddings;
        let low_freq_wavelen = old_ctx / s.low_freq_factor;
        let high_freq_wavelen = old_ctx / s.high_freq_factor;
        for f in &mut inv {
            let wavelen = 2.0 * std::f32::consts::PI / *f;
            let scaled = if wavelen > low_freq_wavelen {
                *f / s.factor
            } else {
                *f
            };
            // transformers: ~(wavelen < high) * ~(wavelen > low).
            let is_medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
            *f = if is_medium {
                let smooth = (old_ctx / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * scaled / s.factor + smooth * scaled
            } else {
                scaled
            };
        }
    }
    inv
}

/// Applies RoPE in place to `x`, shaped `[positions.len(), n_heads *
/// head_dim]`, token `t` being at absolute position `positions[t]`.
///
/// For every head the first `rotary_dim` dimensions are rotated with
/// `angle_j = (pos as f32) * inv_freq[j]` (f32 `cos`/`sin`, as transformers
/// computes them in float32), `j in 0..rotary_dim / 2`:
/// `(a, b) -> (a·cos - b·sin, b·cos + a·sin)`, where the pair `(a, b)` is
/// `(x[j], x[j + rotary_dim / 2])` (Hugging Face `rotate_half` layout) or,
/// with `interleaved` (GLM / GPT-J style), `(x[2j], x[2j + 1])`.
/// Dimensions `rotary_dim..head_dim` pass through unchanged.
/// `inv_freq` has at least `rotary_dim / 2` elements.
pub fn apply_rope(
    x: &mut [f32],
    positions: &[usize],
    n_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    inv_freq: &[f32],
    interleaved: bool,
) {
    let width = n_heads * head_dim;
    debug_assert_eq!(
        x.len(),
        positions.len() * width,
        "x must be [tokens, n_heads * head_dim]"
    );
    debug_assert!(rotary_dim <= head_dim, "rotary_dim must be <= head_dim");
    debug_assert!(rotary_dim.is_multiple_of(2), "rotary_dim must be even");
    let half = (rotary_dim.min(head_dim) / 2).min(inv_freq.len());
    debug_assert_eq!(
        half,
        rotary_dim / 2,
        "inv_freq must have rotary_dim / 2 elements"
    );
    if width == 0 || half == 0 {
        return;
    }
    let mut angles = vec![0.0f32; 2 * half];
    for (row, &pos) in x.chunks_exact_mut(width).zip(positions) {
        rope_angles_into(pos, &inv_freq[..half], &mut angles);
        rotate_token(row, head_dim, &angles, interleaved);
    }
}

/// Writes the RoPE angles of a token at position `pos` into `row`
/// (`2 · inv_freq.len()` values): `cos(pos · inv_freq[j])` for every `j`,
/// then the sines, each angle `(pos as f32) * inv_freq[j]` in f32 as
/// [`apply_rope`] takes it.
pub fn rope_angles_into(pos: usize, inv_freq: &[f32], row: &mut [f32]) {
    let (cos, sin) = row.split_at_mut(inv_freq.len());
    let p = pos as f32;
    for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
        let angle = p * f;
        *c = angle.cos();
        *s = angle.sin();
    }
}

/// [`apply_rope`] with each token's angles already computed: row `t` of
/// `angles` (`[tokens, rotary_dim]`) holds what [`rope_angles_into`] writes
/// for token `t`'s position, so the results are the same bits.
pub fn apply_rope_angles(
    x: &mut [f32],
    angles: &[f32],
    n_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    interleaved: bool,
) {
    let width = n_heads * head_dim;
    debug_assert!(rotary_dim <= head_dim, "rotary_dim must be <= head_dim");
    debug_assert!(rotary_dim.is_multiple_of(2), "rotary_dim must be even");
    if width == 0 || rotary_dim == 0 {
        return;
    }
    debug_assert_eq!(
        angles.len() / rotary_dim,
        x.len() / width,
        "one row of angles per token"
    );
    for (row, token_angles) in x
        .chunks_exact_mut(width)
        .zip(angles.chunks_exact(rotary_dim))
    {
        rotate_token(row, head_dim, token_angles, interleaved);
    }
}

/// Rotates every head of one token's row by `angles` (`[cos; half][sin;
/// half]`, `half` pairs per head).
#[inline]
fn rotate_token(row: &mut [f32], head_dim: usize, angles: &[f32], interleaved: bool) {
    let half = angles.len() / 2;
    let (cos, sin) = angles.split_at(half);
    for head in row.chunks_exact_mut(head_dim) {
        if interleaved {
            for ((pair, &c), &s) in head[..2 * half].chunks_exact_mut(2).zip(cos).zip(sin) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = b * c + a * s;
            }
        } else {
            let (lo, hi) = head[..2 * half].split_at_mut(half);
            for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
                let (va, vb) = (*a, *b);
                *a = va * c - vb * s;
                *b = vb * c + va * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{assert_close, Rng};

    #[test]
    fn llama3_inv_freq_matches_transformers() {
        let s = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let got = rope_inv_freq(16, 1e4, Some(&s));
        let want = [
            1.0, 0.24438, 0.013042, 0.0039528, 0.00125, 3.9528e-4, 1.25e-4, 3.9528e-5,
        ];
        // Relative tolerance 1e-4 (the reference has 5 significant digits).
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(((g - w) / w).abs() < 1e-4, "got {g}, want {w}");
        }
    }

    #[test]
    fn plain_inv_freq() {
        let got = rope_inv_freq(10, 500_000.0, None);
        let want: Vec<f64> = (0..5)
            .map(|j| 500_000f64.powf(-(2.0 * j as f64) / 10.0))
            .collect();
        // Rounded from f64: within one f32 rounding (rel 1e-7).
        assert_close(&got, &want, 0.0, 1e-7);
        assert!(rope_inv_freq(0, 1e4, None).is_empty());
    }

    /// f64 reference with the angle computed in f32 as specified, then
    /// cos/sin in f64.
    fn reference(
        x: &[f32],
        positions: &[usize],
        n_heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        inv_freq: &[f32],
        interleaved: bool,
    ) -> Vec<f64> {
        let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let half = rotary_dim / 2;
        for (t, &pos) in positions.iter().enumerate() {
            for h in 0..n_heads {
                let base = t * n_heads * head_dim + h * head_dim;
                for (j, &f) in inv_freq.iter().enumerate().take(half) {
                    let angle = (pos as f32 * f) as f64;
                    let (c, s) = (angle.cos(), angle.sin());
                    let (ia, ib) = if interleaved {
                        (base + 2 * j, base + 2 * j + 1)
                    } else {
                        (base + j, base + j + half)
                    };
                    let (a, b) = (x[ia] as f64, x[ib] as f64);
                    out[ia] = a * c - b * s;
                    out[ib] = b * c + a * s;
                }
            }
        }
        out
    }

    #[test]
    fn apply_rope_matches_reference() {
        let mut rng = Rng::new(21);
        // (n_heads, head_dim, rotary_dim): full, partial (GLM/Phi), odd heads.
        for &(n_heads, head_dim, rotary_dim) in
            &[(1, 2, 2), (3, 8, 8), (2, 16, 8), (5, 10, 6), (2, 64, 32)]
        {
            for interleaved in [false, true] {
                let inv = rope_inv_freq(rotary_dim, 10_000.0, None);
                let positions = [0usize, 1, 7, 100, 4095];
                let x = rng.vec(positions.len() * n_heads * head_dim, 1.0);
                let mut got = x.clone();
                apply_rope(
                    &mut got,
                    &positions,
                    n_heads,
                    head_dim,
                    rotary_dim,
                    &inv,
                    interleaved,
                );
                let want = reference(
                    &x,
                    &positions,
                    n_heads,
                    head_dim,
                    rotary_dim,
                    &inv,
                    interleaved,
                );
                // |got - want| <= 1e-5 + 1e-5 |want| (f32 cos/sin vs f64).
                assert_close(&got, &want, 1e-5, 1e-5);
                // Pass-through dims are bit-identical.
                for (t, _) in positions.iter().enumerate() {
                    for h in 0..n_heads {
                        let base = (t * n_heads + h) * head_dim;
                        assert_eq!(
                            got[base + rotary_dim..base + head_dim],
                            x[base + rotary_dim..base + head_dim]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let mut rng = Rng::new(22);
        let inv = rope_inv_freq(8, 10_000.0, None);
        let x = rng.vec(2 * 8, 1.0);
        let mut got = x.clone();
        apply_rope(&mut got, &[0], 2, 8, 8, &inv, false);
        assert_eq!(got, x);
    }
}
