//! Elementwise work split over the pool when a tensor is large (prefill),
//! in pieces whose bounds keep every element on the kernel path it takes
//! in one call over the whole tensor.

use rayon::prelude::*;
use rayon::ThreadPool;

/// Elements per task: a multiple of every kernel's vector width, so that
/// only the last piece ends in a partial vector, as the whole tensor does.
pub(crate) const PIECE: usize = 16 * 1024;

/// Runs `f(start, piece)` over consecutive pieces of [`PIECE`] elements of
/// `output` (`start` is the index of the piece's first element): in `pool`
/// when `output` has more than one piece, else as one call.
pub(crate) fn for_pieces(
    pool: &ThreadPool,
    output: &mut [f32],
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if output.len() <= PIECE {
        f(0, output);
        return;
    }
    pool.install(|| {
        output
            .par_chunks_mut(PIECE)
            .enumerate()
            .for_each(|(i, piece)| f(i * PIECE, piece))
    });
}
