//! Portable scalar kernels of the f32-activation path: the dot product of a
//! quantized weight row with f32 activations (block by block through an
//! exact dequantization), and the f32 tile product for prefill.

use super::matmul::dot;
use crate::quant::QuantType;

/// Largest block length of the supported formats.
const MAX_BLOCK: usize = 256;

/// `Σ_i w[i]·x[i]` for a row of blocks `w` and f32 activations `x`.
pub(crate) fn dot_row(qt: QuantType, w: &[u8], x: &[f32]) -> f32 {
    let (n, bytes) = (qt.block_len(), qt.block_bytes());
    let mut buf = [0.0f32; MAX_BLOCK];
    let buf = &mut buf[..n];
    let mut acc = 0.0f32;
    for (b, xs) in w.chunks_exact(bytes).zip(x.chunks_exact(n)) {
        qt.dequantize_blocks(b, buf);
        acc += dot(buf, xs);
    }
    acc
}

/// `dst[o·nr + t] = Σ_i xb[t·k + i] · wb[o·k + i]` (`dst` is `[no, nr]`).
pub(crate) fn gemm_tile(xb: &[f32], nr: usize, k: usize, wb: &[f32], no: usize, dst: &mut [f32]) {
    for (o, d) in dst.chunks_exact_mut(nr).enumerate().take(no) {
        let wr = &wb[o * k..(o + 1) * k];
        for (t, v) in d.iter_mut().enumerate() {
            *v = dot(&xb[t * k..(t + 1) * k], wr);
        }
    }
}
