//! The portable f32 tile product of the f32-activation path.

use super::matmul::dot;

/// `dst[o·nr + t] = Σ_i xb[t·k + i] · wb[o·k + i]` (`dst` is `[no, nr]`).
pub(crate) fn gemm_tile(xb: &[f32], nr: usize, k: usize, wb: &[f32], no: usize, dst: &mut [f32]) {
    for (o, d) in dst.chunks_exact_mut(nr).enumerate().take(no) {
        let wr = &wb[o * k..(o + 1) * k];
        for (t, v) in d.iter_mut().enumerate() {
            *v = dot(&xb[t * k..(t + 1) * k], wr);
        }
    }
}
