//! Token embedding lookup.

use super::matmul::WeightElem;

/// Embedding lookup: `out[t, :] = table[ids[t], :]` converted to f32.
///
/// `table` is `[vocab, dim]` row-major (vocab = `table.len() / dim`) and
/// `out` is `[ids.len(), dim]`. The caller guarantees `ids[t] < vocab`
/// (checked by `debug_assert!`); in release builds an out-of-range id yields
/// a row of zeros instead of a panic.
pub fn embedding<W: WeightElem>(ids: &[u32], table: &[W], dim: usize, out: &mut [f32]) {
    debug_assert_eq!(out.len(), ids.len() * dim, "out must be [ids.len(), dim]");
    if dim == 0 {
        return;
    }
    debug_assert!(
        table.len().is_multiple_of(dim),
        "table must be [vocab, dim]"
    );
    let vocab = table.len() / dim;
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(dim)) {
        let id = id as usize;
        debug_assert!(id < vocab, "token id {id} out of range (vocab {vocab})");
        match table.get(id * dim..(id + 1) * dim) {
            Some(src) => W::convert_slice(src, row),
            None => row.fill(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::Rng;
    use half::{bf16, f16};

    fn check<W: WeightElem>(make: impl Fn(f32) -> W) {
        let mut rng = Rng::new(7);
        for &dim in &[1, 7, 33] {
            let vocab = 11;
            let table: Vec<W> = rng.vec(vocab * dim, 1.0).into_iter().map(&make).collect();
            let ids: Vec<u32> = (0..5).map(|_| rng.below(vocab) as u32).collect();
            let mut out = vec![f32::NAN; ids.len() * dim];
            embedding(&ids, &table, dim, &mut out);
            for (t, &id) in ids.iter().enumerate() {
                for d in 0..dim {
                    // Conversion to f32 is exact: bit-for-bit equality.
                    assert_eq!(out[t * dim + d], table[id as usize * dim + d].to_f32());
                }
            }
        }
    }

    #[test]
    fn embedding_all_dtypes() {
        check(|v| v);
        check(f16::from_f32);
        check(bf16::from_f32);
    }

    #[test]
    fn embedding_empty() {
        let mut out: [f32; 0] = [];
        embedding::<f32>(&[], &[1.0, 2.0], 2, &mut out);
    }
}
