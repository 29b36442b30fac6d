//! Writing float32 arrays as NumPy `.npy` files (format version 1.0).

use std::io::Write;
use std::path::Path;

use crate::{Error, Result};

/// The bytes of a little-endian float32 C-order `.npy` file.
pub fn npy_f32_bytes(shape: &[usize], data: &[f32]) -> Result<Vec<u8>> {
    let numel: usize = shape.iter().product();
    if numel != data.len() {
        return Err(Error::shape(
            "npy",
            format!("shape {shape:?} holds {numel} values, got {}", data.len()),
        ));
    }
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // Magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Ok(out)
}

/// Writes a float32 `.npy` file atomically (temp file + rename).
pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let bytes = npy_f32_bytes(shape, data)?;
    crate::atomic::write_atomically(path, |out| {
        out.write_all(&bytes).map_err(|e| Error::io(path, e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_data_follows() {
        let b = npy_f32_bytes(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)"), "{header}");
        assert!(header.ends_with('\n'));
        assert_eq!(b.len(), 10 + hlen + 24);
        assert_eq!(&b[10 + hlen + 4..10 + hlen + 8], &1.0f32.to_le_bytes());
        assert!(npy_f32_bytes(&[4], &[1.0]).is_err());
    }
}
