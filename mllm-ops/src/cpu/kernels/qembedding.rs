//! Token embedding lookup in a block-quantized table.

use super::qmatmul::QuantMatrix;

/// `out[t, :] = dequantize(table[ids[t], :])`, bit-exact with
/// [`crate::quant::dequantize`].
///
/// `table` is `[vocab, dim]` and `out` is `[ids.len(), dim]`. The caller
/// guarantees `ids[t] < vocab` (checked by `debug_assert!`); in release
/// builds an out-of-range id yields a row of zeros instead of a panic.
pub fn quant_embedding(ids: &[u32], table: &QuantMatrix<'_>, out: &mut [f32]) {
    let dim = table.cols();
    debug_assert_eq!(out.len(), ids.len() * dim, "out must be [ids.len(), dim]");
    if dim == 0 {
        return;
    }
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(dim)) {
        let id = id as usize;
        debug_assert!(id < table.rows(), "token id {id} out of range");
        if id < table.rows() {
            table.quant_type().dequantize_blocks(table.row(id), row);
        } else {
            row.fill(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::qkernel::tests::random_blocks;
    use crate::cpu::kernels::test_util::Rng;
    use crate::quant::QuantType;

    #[test]
    fn rows_are_dequantized_exactly() {
        let mut rng = Rng::new(41);
        for qt in QuantType::ALL {
            let (vocab, dim) = (5, 2 * qt.block_len());
            let table = random_blocks(&mut rng, qt, vocab * 2);
            let mut all = vec![0.0; vocab * dim];
            qt.dequantize_blocks(&table, &mut all);
            let m = QuantMatrix::new(qt, &table, vocab, dim).unwrap();
            let ids = [4, 0, 2, 2];
            let mut out = vec![f32::NAN; ids.len() * dim];
            quant_embedding(&ids, &m, &mut out);
            for (t, &id) in ids.iter().enumerate() {
                let want = &all[id as usize * dim..][..dim];
                assert_eq!(&out[t * dim..][..dim], want, "{qt} token {t}");
            }
        }
    }
}
