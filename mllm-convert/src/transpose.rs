//! Transposition of row-major 2-D tensors stored as raw bytes.

use mllm_core::{Error, Result};

/// Transposes `src`, a row-major `[rows, cols]` matrix of `elem`-byte
/// elements, into a row-major `[cols, rows]` matrix.
pub fn transpose_bytes(src: &[u8], rows: usize, cols: usize, elem: usize) -> Result<Vec<u8>> {
    let expected = rows
        .checked_mul(cols)
        .and_then(|n| n.checked_mul(elem))
        .ok_or_else(|| Error::InvalidInput(format!("[{rows}, {cols}] is too large")))?;
    if src.len() != expected || elem == 0 {
        return Err(Error::InvalidInput(format!(
            "{} bytes are not a [{rows}, {cols}] matrix of {elem}-byte elements",
            src.len()
        )));
    }
    let mut out = vec![0u8; expected];
    for (r, row) in src.chunks_exact(cols * elem).enumerate() {
        for (c, x) in row.chunks_exact(elem).enumerate() {
            let at = (c * rows + r) * elem;
            out[at..at + elem].copy_from_slice(x);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_multi_byte_elements() {
        // [2, 3] of u16: [[1, 2, 3], [4, 5, 6]] -> [[1, 4], [2, 5], [3, 6]].
        let src: Vec<u8> = [1u16, 2, 3, 4, 5, 6]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let out = transpose_bytes(&src, 2, 3, 2).unwrap();
        let got: Vec<u16> = out
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(got, [1, 4, 2, 5, 3, 6]);
        assert!(transpose_bytes(&src, 3, 3, 2).is_err());
        assert!(transpose_bytes(&src, usize::MAX, 3, 2).is_err());
    }
}
