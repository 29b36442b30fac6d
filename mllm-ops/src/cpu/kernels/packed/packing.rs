//! How packers read their sources and fill a packed matrix: the rows of
//! one or more stacked quantized matrices, and the packing of row groups
//! in parallel runs that report the source rows they are done with.

use std::ops::Range;

use mllm_core::{Error, Result};
use rayon::prelude::*;

use super::GROUP_ROWS;
use crate::cpu::kernels::qmatmul::QuantMatrix;
use crate::quant::QuantType;

/// The rows of one or more quantized matrices of one block type and
/// width, one after another: what a packer reads (several for stacked
/// linear layers, packed as one matrix).
#[derive(Clone, Copy)]
pub(crate) struct SourceRows<'p, 'a> {
    parts: &'p [QuantMatrix<'a>],
    /// The rows of each part when all have as many (a direct lookup).
    uniform_rows: Option<usize>,
}

impl<'p, 'a> SourceRows<'p, 'a> {
    /// `parts` as the source of the packed layout `layout` made for the
    /// block types `types`: at least one, each of one of those types (all
    /// the same, of one width) and with rows that fill whole groups of
    /// [`GROUP_ROWS`].
    pub(crate) fn new(
        parts: &'p [QuantMatrix<'a>],
        types: &[QuantType],
        layout: &str,
    ) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidInput(format!(
                "no matrix to pack as {layout}"
            )));
        };
        for w in parts {
            let qt = w.quant_type();
            if !types.contains(&qt) {
                let names: Vec<String> = types.iter().map(|t| t.to_string()).collect();
                return Err(Error::UnsupportedDType(format!(
                    "only {} weights can be packed as {layout}, not {qt}",
                    names.join(" and ")
                )));
            }
            if qt != first.quant_type() || w.cols() != first.cols() {
                return Err(Error::InvalidInput(format!(
                    "matrices packed as one must share a type and a width: {} x {} and {qt} x {}",
                    first.quant_type(),
                    first.cols(),
                    w.cols()
                )));
            }
            if !w.rows().is_multiple_of(GROUP_ROWS) {
                return Err(Error::InvalidInput(format!(
                    "{} rows are not a whole number of {GROUP_ROWS}-row groups",
                    w.rows()
                )));
            }
        }
        let uniform_rows = Some(first.rows()).filter(|&n| parts.iter().all(|w| w.rows() == n));
        Ok(SourceRows {
            parts,
            uniform_rows,
        })
    }

    /// The block type.
    pub(crate) fn quant_type(&self) -> QuantType {
        self.parts[0].quant_type()
    }

    /// Values per row.
    pub(crate) fn cols(&self) -> usize {
        self.parts[0].cols()
    }

    /// Rows of every part.
    pub(crate) fn rows(&self) -> usize {
        self.parts.iter().map(|w| w.rows()).sum()
    }

    /// The blocks of row `r` of the stack.
    pub(crate) fn row(&self, r: usize) -> &'a [u8] {
        if let Some(n) = self.uniform_rows.filter(|&n| n > 0) {
            return self.parts[r / n].row(r % n);
        }
        let (part, r) = stacked_row(self.parts.iter().map(|w| w.rows()), r);
        self.parts[part].row(r)
    }
}

/// Which part holds row `r` of parts of `part_rows` rows stacked one after
/// another, and the row's index within it.
pub(crate) fn stacked_row(part_rows: impl IntoIterator<Item = usize>, r: usize) -> (usize, usize) {
    match stacked_ranges(part_rows, r..r + 1).next() {
        Some((part, rows)) => (part, rows.start),
        None => panic!("row {r} past the stacked rows"),
    }
}

/// The stacked rows `r` of parts of `part_rows` rows stacked one after
/// another, part by part: each part they reach and the rows within it.
pub(crate) fn stacked_ranges(
    part_rows: impl IntoIterator<Item = usize>,
    r: Range<usize>,
) -> impl Iterator<Item = (usize, Range<usize>)> {
    let mut first = 0;
    part_rows
        .into_iter()
        .enumerate()
        .filter_map(move |(part, rows)| {
            let (lo, hi) = (r.start.max(first), r.end.min(first + rows));
            first += rows;
            (lo < hi).then(|| (part, lo + rows - first..hi + rows - first))
        })
}

/// Source bytes packed between two calls of a packer's progress callback
/// (see `pack_blocks` and `PackedHalf::pack_with`).
pub const RELEASE_BYTES: usize = 4 << 20;

/// Fills `data` (row groups one after the other, each `blocks` blocks of
/// `block_bytes`) with `pack_block(group, block, bytes)`, in parallel over
/// runs of groups (at most about [`RELEASE_BYTES`] each, and four runs per
/// thread at least) in the current rayon pool (a linear op packs in its
/// own), calling `copied` with the source rows of each run once it is
/// packed, so that a caller reading a mapped source can release it as it
/// goes (runs finish in any order, on any thread); the first error, if
/// any, is returned.
pub(crate) fn pack_blocks(
    data: &mut [u8],
    block_bytes: usize,
    blocks: usize,
    copied: &(dyn Fn(Range<usize>) + Sync),
    pack_block: impl Fn(usize, usize, &mut [u8]) -> Result<()> + Sync,
) -> Result<()> {
    let group_bytes = blocks * block_bytes;
    if group_bytes == 0 {
        return Ok(());
    }
    let groups = data.len() / group_bytes;
    let per_run = RELEASE_BYTES
        .div_ceil(group_bytes)
        .min(groups.div_ceil(4 * rayon::current_num_threads()))
        .max(1);
    data.par_chunks_mut(per_run * group_bytes)
        .enumerate()
        .try_for_each(|(run, bytes)| {
            let first = run * per_run;
            for (g, group) in bytes.chunks_exact_mut(group_bytes).enumerate() {
                for (i, out) in group.chunks_exact_mut(block_bytes).enumerate() {
                    pack_block(first + g, i, out)?;
                }
            }
            let packed = bytes.len() / group_bytes;
            copied(first * GROUP_ROWS..(first + packed) * GROUP_ROWS);
            Ok(())
        })
}
