//! Tile panels for the AVX-512 f16/bf16 kernel
//! (`simd::avx512_packed_half`), and the linear layer's products through
//! them: the rows of each tile of [`HALF_TILE_TOKENS`] laid side by side,
//! column pair by column pair, so that the kernel finds every activation
//! pair it broadcasts at a fixed offset from one pointer.

use super::{PackedHalf, COLUMN_BYTES, HALF_TILE_TOKENS};
use crate::cpu::kernels::packed::{group_outputs, RowOutputs, GROUP_ROWS};
use crate::cpu::kernels::qmatmul::Split;
use crate::cpu::kernels::simd;

/// The products of the AVX-512 kernel for the activation rows `xb`: the
/// rows go into tile panels (see [`fill_panels`]) a part at a time, and
/// each part's outputs into `yt`. A single row is its own panel.
pub(super) fn panel_products(w: &PackedHalf, xb: &[f32], split: &Split<'_>, yt: &mut [f32]) {
    let (in_f, out_f) = (w.cols(), w.rows());
    let groups = |g, n| w.data.groups(g, n);
    let group_bytes = in_f * COLUMN_BYTES;
    let mut panels = Vec::new();
    let part = panel_part_rows(in_f);
    for (xc, yc) in xb.chunks(part * in_f).zip(yt.chunks_mut(part * out_f)) {
        let laid = if xc.len() == in_f {
            xc
        } else {
            fill_panels(xc, in_f, &mut panels);
            &panels
        };
        let tiles = tile_panels(laid, in_f);
        let dot = |g: &[u8], tile: &[TilePanel<'_>], out: &mut [[f32; GROUP_ROWS]], reads| {
            // SAFETY: `packed_half_linear` calls this only with a kernel at
            // the AVX-512 level, which is made only where the CPU has AVX2,
            // FMA, F16C and AVX-512F (`QuantKernel` invariant).
            unsafe {
                let panel = (tile[0].0, tile.len());
                simd::avx512_packed_half::panel_dot(w.kind, g, group_bytes, panel, out, reads)
            }
        };
        let groups = (&groups, RowOutputs::Each);
        group_outputs(groups, in_f, &tiles, HALF_TILE_TOKENS, split, yc, dot);
    }
}

/// One activation row's entry for the AVX-512 kernel: the panel of the
/// tile of [`HALF_TILE_TOKENS`] rows it belongs to (every row of a tile
/// names the same panel; `group_outputs` hands the kernel whole tiles).
#[derive(Clone, Copy)]
struct TilePanel<'a>(&'a [f32]);

/// The entries of the rows laid out in `panels` by [`fill_panels`]
/// (`cols` values each), one per row, in row order.
fn tile_panels(panels: &[f32], cols: usize) -> Vec<TilePanel<'_>> {
    panels
        .chunks(HALF_TILE_TOKENS * cols)
        .flat_map(|p| std::iter::repeat_n(TilePanel(p), p.len() / cols))
        .collect()
}

/// Lays the rows of `x` (`cols` values each, `cols` even) out in `into`
/// as tile panels, one per [`HALF_TILE_TOKENS`] rows (the last one may
/// have fewer): a panel of `t` rows holds, for each pair of columns in
/// order, the pair's two values of each of its rows in row order, so the
/// kernel reads every broadcast at a fixed offset from one pointer. The
/// values are the same, so the products' bits are.
fn fill_panels(x: &[f32], cols: usize, into: &mut Vec<f32>) {
    into.clear();
    into.resize(x.len(), 0.0);
    let tiles = x.chunks(HALF_TILE_TOKENS * cols);
    for (tile, panel) in tiles.zip(into.chunks_mut(HALF_TILE_TOKENS * cols)) {
        let t = tile.len() / cols;
        let steps = panel.as_chunks_mut::<2>().0;
        for (r, row) in tile.chunks_exact(cols).enumerate() {
            for (k, pair) in row.as_chunks::<2>().0.iter().enumerate() {
                steps[k * t + r] = *pair;
            }
        }
    }
}

/// Activation values laid out in panels at a time (1.5 MiB): 48 rows of
/// 8192, a whole 128-row block of rows up to 3072 wide. A copy of a whole
/// block of 8192-wide rows raised the peak memory of a 1.1B F16 model's
/// 128-token prefill by 4-8 MiB; in parts the weights stream past more
/// often, which is why narrower rows stay whole.
const PANEL_VALUES: usize = 48 * 8192;

/// Rows of `cols` values laid out in panels at a time: whole tiles, at
/// least one.
fn panel_part_rows(cols: usize) -> usize {
    (PANEL_VALUES / cols / HALF_TILE_TOKENS * HALF_TILE_TOKENS).max(HALF_TILE_TOKENS)
}

#[cfg(test)]
mod tests {
    use super::super::group_dot;
    use super::super::tests::{random_matrix, KINDS};
    use super::*;
    use crate::cpu::kernels::packed::WeightReads;
    use crate::cpu::kernels::qact::BLOCK;
    use crate::cpu::kernels::qkernel::tests::kernel_or_skip;
    use crate::cpu::kernels::qkernel::{QuantPath, SimdLevel};
    use crate::cpu::kernels::test_util::Rng;

    /// Each tile's panel holds its rows' values column pair by column
    /// pair, the last tile its fewer rows, every row names its tile's
    /// panel, and a reused buffer keeps nothing of its old values.
    #[test]
    fn panels_hold_each_tiles_rows_pair_by_pair() {
        assert_eq!(panel_part_rows(8192), 48);
        assert_eq!(panel_part_rows(2048), 192);
        assert_eq!(panel_part_rows(1 << 20), HALF_TILE_TOKENS);
        let cols = 6;
        let mut panels = vec![f32::NAN; 1000];
        for rows in [HALF_TILE_TOKENS + 2, 1] {
            let x: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
            fill_panels(&x, cols, &mut panels);
            assert_eq!(panels.len(), x.len());
            let tiles = tile_panels(&panels, cols);
            assert_eq!(tiles.len(), rows);
            for (r, row) in x.chunks_exact(cols).enumerate() {
                let (tile, within) = (r / HALF_TILE_TOKENS, r % HALF_TILE_TOKENS);
                let start = tile * HALF_TILE_TOKENS * cols;
                let t = (rows - tile * HALF_TILE_TOKENS).min(HALF_TILE_TOKENS);
                assert_eq!(
                    tiles[r].0,
                    &panels[start..start + t * cols],
                    "row {r}'s panel"
                );
                for k in 0..cols / 2 {
                    let at = start + 2 * (k * t + within);
                    assert_eq!(
                        panels[at..at + 2],
                        row[2 * k..2 * k + 2],
                        "row {r} pair {k}"
                    );
                }
            }
        }
    }

    /// The AVX-512 kernel's products of one group and of two, for one to
    /// [`HALF_TILE_TOKENS`] rows, equal the portable ones bit for bit.
    #[test]
    fn avx512_panel_products_equal_the_portable_ones() {
        let mut rng = Rng::new(96);
        let cols = 5 * BLOCK;
        let xs: Vec<Vec<f32>> = (0..HALF_TILE_TOKENS).map(|_| rng.vec(cols, 3.0)).collect();
        let xs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
        for kind in KINDS {
            let (bits, _) = random_matrix(&mut rng, kind, 2 * GROUP_ROWS * cols, 1.0);
            let p = PackedHalf::pack(&bits, kind, 2 * GROUP_ROWS, cols).unwrap();
            check_panel_products(&p, &xs, &format!("{kind:?}"));
        }
    }

    /// The AVX-512 kernel's products of `p`'s first group and of its first
    /// two groups with the panels of the first one to all rows of `xs`
    /// equal the portable products bit for bit, with either kind of read.
    fn check_panel_products(p: &PackedHalf, xs: &[&[f32]], what: &str) {
        if kernel_or_skip(QuantPath::Int16Activations, SimdLevel::Avx512).is_none() {
            return;
        }
        let cols = p.cols();
        let group_bytes = cols * COLUMN_BYTES;
        for t in 1..=xs.len() {
            let x: Vec<f32> = xs[..t].concat();
            let mut panel = Vec::new();
            fill_panels(&x, cols, &mut panel);
            for n in 1..=2 {
                let groups = p.data.groups(0, n);
                let mut want = vec![[f32::NAN; GROUP_ROWS]; n * t];
                for (g, group) in groups.chunks_exact(group_bytes).enumerate() {
                    let out = &mut want[g * t..(g + 1) * t];
                    group_dot(p.kind(), group, &xs[..t], out);
                }
                for reads in [WeightReads::FromMemory, WeightReads::FromCache] {
                    let mut got = vec![[f32::NAN; GROUP_ROWS]; n * t];
                    // SAFETY: `kernel_or_skip` found the AVX-512 level, so
                    // the CPU has AVX2, FMA, F16C and AVX-512F.
                    unsafe {
                        simd::avx512_packed_half::panel_dot(
                            p.kind(),
                            groups,
                            group_bytes,
                            (&panel, t),
                            &mut got,
                            reads,
                        )
                    };
                    assert_eq!(got, want, "{what}: {reads:?}, {n} groups, {t} rows");
                }
            }
        }
    }
}
