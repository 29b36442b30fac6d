//! Q4_0 and Q4_1 weights in the packed layout (see the parent module's
//! documentation), their portable group products, and the linear layer
//! over them with 16-bit (or, with `--int8-activations`, 8-bit) activation
//! rows.

use std::ops::Range;

use half::f16;
use mllm_core::file::TensorData;
use mllm_core::op::Activation;
use mllm_core::{DType, Error, Result};
use rayon::ThreadPool;

#[cfg(target_arch = "x86_64")]
use super::WeightReads;
use super::{
    amx_pairs_of_rows, avx2_row_runs, pack_blocks, simd_group_products, wide_packed_linear,
    PackedData, PackedFormat, SourceRows, GROUP_ROWS, NIBBLES_AT, PACKED_BLOCK_BYTES,
};
use crate::cpu::kernels::qact::{ActivationScratch, Q16Row, BLOCK, BYTE, WIDE};
use crate::cpu::kernels::qkernel::{QuantKernel, QuantPath};
use crate::cpu::kernels::qmatmul::QuantMatrix;
use crate::cpu::kernels::weight_memory::{WeightArena, WeightMemory};
use crate::quant::{q4_0, q4_1, QuantType};

/// The packed Q4_0 / Q4_1 layout (see the `packed` module documentation) for
/// activation rows split at `SHIFT` ([`WIDE`] or `BYTE`).
pub(crate) struct Q4Format<const SHIFT: u32>;

impl<const SHIFT: u32> PackedFormat for Q4Format<SHIFT> {
    type Input<'a> = Q16Row<'a, SHIFT>;
    const BLOCK_BYTES: usize = PACKED_BLOCK_BYTES;

    fn blocks(x: &Q16Row<'_, SHIFT>) -> usize {
        x.d.len()
    }

    fn portable(group: &[u8], xs: &[Q16Row<'_, SHIFT>], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot(group, xs, out)
    }

    /// # Safety
    /// The trait method's: the CPU has AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_pair(
        a: &[u8],
        b: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (trait contract).
        unsafe { crate::cpu::kernels::simd::avx2_packed_pair::pair_dot(a, b, xs, out, reads) }
    }

    avx2_row_runs!(crate::cpu::kernels::simd::avx2_packed_row::q4_row_run);

    simd_group_products!(
        [],
        Q16Row<'_, SHIFT>,
        avx2_packed,
        avx_vnni_packed::q4,
        vnni_packed
    );

    amx_pairs_of_rows!(crate::cpu::kernels::simd::amx_packed::q4::pairs);
}

/// A Q4_0 or Q4_1 matrix `[rows, cols]` repacked in groups of eight rows
/// (see the `packed` module documentation).
pub struct PackedQ4 {
    data: PackedData,
}

impl PackedQ4 {
    /// Makes the products give `act(gate) · up` (see
    /// `packed::RowOutputs::Gated`): for a matrix packed from a gate and an
    /// up weight group by group in turn.
    pub(crate) fn gate(&mut self, act: Activation) -> Result<()> {
        self.data.gate(act)
    }

    /// Repacks `w`; fails when it is not Q4_0 or Q4_1, when its row count
    /// is not a multiple of eight, or when a Q4_0 offset `-8·d` overflows
    /// f16.
    pub fn pack(w: &QuantMatrix<'_>) -> Result<PackedQ4> {
        Self::pack_with(std::slice::from_ref(w), None, &|_| {})
    }

    /// [`Self::pack`] of `parts`, matrices of one type and width stacked
    /// into one (see `packed::SourceRows`), into a buffer from `arena` (a
    /// buffer of its own without one), calling `copied` with each range of
    /// stacked rows once it is packed (see `packed::pack_blocks`).
    pub fn pack_with(
        parts: &[QuantMatrix<'_>],
        arena: Option<&WeightArena>,
        copied: &(dyn Fn(Range<usize>) + Sync),
    ) -> Result<PackedQ4> {
        let w = SourceRows::new(parts, &[QuantType::Q4_0, QuantType::Q4_1], "q4")?;
        let (rows, cols, qt) = (w.rows(), w.cols(), w.quant_type());
        let nb = cols / BLOCK;
        let mut data = WeightMemory::zeroed_in(arena, rows / GROUP_ROWS * nb * PACKED_BLOCK_BYTES)?;
        pack_blocks(&mut data, PACKED_BLOCK_BYTES, nb, copied, |g, i, out| {
            for r in 0..GROUP_ROWS {
                let (d, m, qs) = block_parts(qt, w.row(g * GROUP_ROWS + r), i)?;
                out[2 * r..2 * r + 2].copy_from_slice(&d);
                out[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&m);
                for j in 0..4 {
                    let at = NIBBLES_AT + 32 * j + 4 * r;
                    out[at..at + 4].copy_from_slice(&qs[4 * j..4 * j + 4]);
                }
            }
            Ok(())
        })?;
        Ok(PackedQ4 {
            data: PackedData::owned(data, rows, cols, PACKED_BLOCK_BYTES),
        })
    }

    /// A `DType::Q4Packed` tensor of `[rows, cols]`, read in place.
    pub fn mapped(data: TensorData, shape: [usize; 2]) -> Result<PackedQ4> {
        let data = PackedData::mapped(data, DType::Q4Packed, shape, PACKED_BLOCK_BYTES)?;
        Ok(PackedQ4 { data })
    }

    /// The packed bytes (what a packed file stores).
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// Row `r`'s values from the packed bytes of its group (`d·q + m`,
    /// the values Q4_0 and Q4_1 dequantize to).
    pub fn unpack_row(group: &[u8], r: usize, out: &mut [f32]) {
        for (blk, out) in group
            .chunks_exact(PACKED_BLOCK_BYTES)
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let f = |at: usize| f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
            let (d, m) = (f(2 * r), f(16 + 2 * r));
            unpack_nibble_block(&blk[NIBBLES_AT..], r, (d, m), out);
        }
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.data.rows()
    }

    /// Values per row (input features).
    pub fn cols(&self) -> usize {
        self.data.cols()
    }

    /// The packed blocks of the `n` row groups from group `g` on.
    pub(crate) fn groups(&self, g: usize, n: usize) -> &[u8] {
        self.data.groups(g, n)
    }
}

/// The f16 scale, the f16 offset and the 16 nibble bytes of block `i` of a
/// Q4_0 or Q4_1 row.
fn block_parts(qt: QuantType, row: &[u8], i: usize) -> Result<([u8; 2], [u8; 2], [u8; 16])> {
    let bytes = qt.block_bytes();
    let b = &row[i * bytes..(i + 1) * bytes];
    let d = [b[0], b[1]];
    if qt == QuantType::Q4_1 {
        let qs = b[4..q4_1::BLOCK_BYTES].try_into().expect("16 bytes");
        return Ok((d, [b[2], b[3]], qs));
    }
    let m = f16::from_f32(-8.0 * f16::from_le_bytes(d).to_f32());
    if !m.is_finite() {
        return Err(Error::InvalidInput(format!(
            "q4_0 scale {} is too large to pack",
            f16::from_le_bytes(d)
        )));
    }
    let qs = b[2..q4_0::BLOCK_BYTES].try_into().expect("16 bytes");
    Ok((d, m.to_le_bytes(), qs))
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (one to [`TILE_TOKENS`] rows), in portable code: per block and row
/// `d·d_x·Σ q_w q_x + m·s_x`, accumulated in f32.
pub(crate) fn group_dot<const SHIFT: u32>(
    group: &[u8],
    xs: &[Q16Row<'_, SHIFT>],
    out: &mut [[f32; GROUP_ROWS]],
) {
    for (x, out) in xs.iter().zip(out.iter_mut()) {
        *out = [0.0; GROUP_ROWS];
        let blocks = group.chunks_exact(PACKED_BLOCK_BYTES);
        let xb = x.hi.chunks_exact(BLOCK).zip(x.lo.chunks_exact(BLOCK));
        for ((blk, (hi, lo)), (&dx, &sx)) in blocks.zip(xb).zip(x.d.iter().zip(x.s)) {
            for (r, acc) in out.iter_mut().enumerate() {
                let f = |at: usize| f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
                let (d, m) = (f(2 * r), f(16 + 2 * r));
                let sum = nibble_block_sum::<SHIFT>(&blk[NIBBLES_AT..], r, hi, lo);
                *acc += d * dx * sum as f32 + m * sx;
            }
        }
    }
}

/// Row `r`'s 32 values `d·q + m` of one block, from the block's 128 bytes
/// of nibbles in the packed chunk layout.
fn unpack_nibble_block(nibbles: &[u8], r: usize, (d, m): (f32, f32), out: &mut [f32]) {
    for j in 0..4 {
        for c in 0..4 {
            let byte = nibbles[32 * j + 4 * r + c];
            out[4 * j + c] = d * (byte & 15) as f32 + m;
            out[16 + 4 * j + c] = d * (byte >> 4) as f32 + m;
        }
    }
}

/// Row `r`'s exact sum `Σ q_w · q_x` over one block of 32 columns, from
/// the block's 128 bytes of nibbles in the packed chunk layout and the
/// block's two activation planes split at `SHIFT` (`q_x = 2^SHIFT·hi +
/// lo`).
pub(crate) fn nibble_block_sum<const SHIFT: u32>(
    nibbles: &[u8],
    r: usize,
    hi: &[i8],
    lo: &[i8],
) -> i32 {
    let mut sum = 0i32;
    for j in 0..4 {
        for c in 0..4 {
            let byte = nibbles[32 * j + 4 * r + c];
            let (k_lo, k_hi) = (4 * j + c, 16 + 4 * j + c);
            let q = |k: usize| ((hi[k] as i32) << SHIFT) + lo[k] as i32;
            sum += (byte & 15) as i32 * q(k_lo) + (byte >> 4) as i32 * q(k_hi);
        }
    }
    sum
}

/// Linear layer over a packed matrix: `y[t, o] = Σ_i x[t, i] · W[o, i] +
/// bias[o]` with the activation rows quantized to 16 bits (two 8-bit
/// planes per block of 32 split at `WIDE`, see `Q16Act`). `x` is
/// `[rows, w.cols()]`, `y` `[rows, w.rows()]`. Parallel over row groups in
/// `pool` unless the work is tiny; `TILE_TOKENS` activation rows share
/// each pass over a group, blocks of `ROW_BLOCK` rows one scratch; the
/// quantized rows go into the buffers of `scratch`.
/// Slice lengths are checked with `debug_assert!`.
#[allow(clippy::too_many_arguments)]
pub fn packed_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ4,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    let w = &w.data;
    if k.path() == QuantPath::Int8Packed {
        wide_packed_linear::<Q4Format<BYTE>, BYTE>(k, x, rows, w, bias, y, pool, scratch)
    } else {
        wide_packed_linear::<Q4Format<WIDE>, WIDE>(k, x, rows, w, bias, y, pool, scratch)
    }
}
