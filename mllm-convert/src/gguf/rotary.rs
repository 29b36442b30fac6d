//! The q/k row order of llama.cpp's Llama files and its inverse.

use mllm_core::{Error, Result};

/// The row of the GGUF tensor that holds Hugging Face row `hf_row` of a
/// rotary projection with heads of `head_dim` rows.
///
/// Hugging Face keeps each head's rows in rotate-half order: the first half
/// of the head's rows pairs element-wise with the second half. GGUF Llama
/// files store the two halves interleaved instead (half 0 row `j` at `2j`,
/// half 1 row `j` at `2j + 1`), the order that rotates adjacent pairs.
pub fn gguf_row_of(hf_row: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let head = hf_row / head_dim;
    let within = hf_row % head_dim;
    head * head_dim + 2 * (within % half) + within / half
}

/// Reorders the rows of a GGUF q/k projection into the Hugging Face order.
///
/// Rows are moved whole (`row_bytes` each), so this works for quantized
/// rows as well: quantization blocks never cross a row.
pub fn unpermute_rows(data: &[u8], row_bytes: usize, heads: usize) -> Result<Vec<u8>> {
    let rows = data.len().checked_div(row_bytes).unwrap_or(0);
    if row_bytes == 0 || rows * row_bytes != data.len() || heads == 0 || !rows.is_multiple_of(heads)
    {
        return Err(Error::shape(
            "q/k row reordering",
            format!(
                "{} bytes are not {heads} heads of whole rows of {row_bytes} bytes",
                data.len()
            ),
        ));
    }
    let head_dim = rows / heads;
    if !head_dim.is_multiple_of(2) {
        return Err(Error::shape(
            "q/k row reordering",
            format!("{rows} rows in {heads} heads give an odd head dimension {head_dim}"),
        ));
    }
    let mut out = Vec::with_capacity(data.len());
    for hf_row in 0..rows {
        let src = gguf_row_of(hf_row, head_dim) * row_bytes;
        out.extend_from_slice(&data[src..src + row_bytes]);
    }
    Ok(out)
}
