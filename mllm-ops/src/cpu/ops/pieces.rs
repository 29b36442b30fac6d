//! Elementwise and row-by-row work split over the pool when a tensor is
//! large (prefill), in pieces whose bounds keep every element on the
//! kernel path it takes in one call over the whole tensor.

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
    for_row_pieces(pool, output, 1, f);
}

/// Runs `f(first_row, piece)` over consecutive pieces of whole rows of
/// `row_len` elements of `output` (`first_row` is the index of the piece's
/// first row), each at least [`PIECE`] elements: in `pool` when `output`
/// has more than one such piece, else as one call. For ops whose rows are
/// computed independently (norms, rotary embeddings), so that a row's
/// result does not depend on the split.
pub(crate) fn for_row_pieces(
    pool: &ThreadPool,
    output: &mut [f32],
    row_len: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    let rows_per_piece = PIECE.div_ceil(row_len.max(1));
    let piece = rows_per_piece * row_len;
    if row_len == 0 || output.len() <= piece {
        f(0, output);
        return;
    }
    pool.install(|| {
        output
            .par_chunks_mut(piece)
            .enumerate()
            .for_each(|(i, rows)| f(i * rows_per_piece, rows))
    });
}
