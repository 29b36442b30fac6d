//! Column slicing of row-major matrices.

/// Copies columns `start..start + len` of each row of `x` (`[rows, cols]`)
/// into `out` (`[rows, len]`). The caller guarantees `start + len <= cols`.
pub fn slice_columns(x: &[f32], cols: usize, start: usize, len: usize, out: &mut [f32]) {
    debug_assert!(start + len <= cols, "columns out of range");
    if len == 0 || cols == 0 {
        return;
    }
    debug_assert!(x.len().is_multiple_of(cols), "x must be [rows, cols]");
    debug_assert_eq!(out.len(), x.len() / cols * len, "out must be [rows, len]");
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(len)) {
        o.copy_from_slice(&row[start..start + len]);
    }
}

/// Copies each row of `part` (`[rows, len]`) into columns
/// `start..start + len` of the same row of `out` (`[rows, cols]`), the
/// inverse of [`slice_columns`]. The caller guarantees `start + len <= cols`.
pub fn place_columns(part: &[f32], len: usize, out: &mut [f32], cols: usize, start: usize) {
    debug_assert!(start + len <= cols, "columns out of range");
    if len == 0 || cols == 0 {
        return;
    }
    debug_assert_eq!(part.len() / len, out.len() / cols, "one part row per row");
    for (src, row) in part.chunks_exact(len).zip(out.chunks_exact_mut(cols)) {
        row[start..start + len].copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_the_requested_columns() {
        // x[r][c] = 10 r + c, 3 rows of 5 columns.
        let x: Vec<f32> = (0..3)
            .flat_map(|r| (0..5).map(move |c| (10 * r + c) as f32))
            .collect();
        let mut out = vec![f32::NAN; 6];
        slice_columns(&x, 5, 2, 2, &mut out);
        assert_eq!(out, [2.0, 3.0, 12.0, 13.0, 22.0, 23.0]);
        let mut all = vec![f32::NAN; 15];
        slice_columns(&x, 5, 0, 5, &mut all);
        assert_eq!(all, x);
    }

    #[test]
    fn placed_columns_are_sliced_back() {
        let x: Vec<f32> = (0..15).map(|v| v as f32).collect();
        let mut out = vec![f32::NAN; 15];
        for (start, len) in [(0, 2), (2, 1), (3, 2)] {
            let mut part = vec![0.0; 3 * len];
            slice_columns(&x, 5, start, len, &mut part);
            place_columns(&part, len, &mut out, 5, start);
        }
        assert_eq!(out, x);
        let mut one = vec![-1.0; 15];
        place_columns(&[7.0, 8.0, 9.0], 1, &mut one, 5, 4);
        let want: Vec<f32> = (0..15)
            .map(|i| [7.0, 8.0, 9.0][i / 5] * f32::from(i % 5 == 4) - f32::from(i % 5 != 4))
            .collect();
        assert_eq!(one, want);
    }
}
