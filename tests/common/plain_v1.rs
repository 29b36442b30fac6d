//! A plain mllm v1 file written without the project's writer, laid out as
//! mllm's own converter writes it: the magic, the index size, the index
//! entries (name, data length, absolute offset, type code), then the
//! tensor data back to back, with no metadata and no alignment.

use std::path::Path;

/// mllm's type code of float32 tensors.
const MLLM_TYPE_F32: i32 = 0;

/// Writes the float32 tensors of a safetensors file, sorted by name and
/// leaving out `skip`, as the plain mllm v1 file `out`.
pub fn write_plain_v1(safetensors: &Path, out: &Path, skip: &[&str]) {
    let bytes = std::fs::read(safetensors).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| !skip.contains(&name.as_str()))
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            (name, view.data().to_vec())
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let index_size: usize = tensors.iter().map(|(n, _)| 4 + n.len() + 8 + 8 + 4).sum();
    let mut offset = (4 + 8 + index_size) as u64;
    let mut file = Vec::new();
    file.extend(20012i32.to_le_bytes());
    file.extend((index_size as u64).to_le_bytes());
    for (name, data) in &tensors {
        file.extend((name.len() as i32).to_le_bytes());
        file.extend(name.as_bytes());
        file.extend((data.len() as u64).to_le_bytes());
        file.extend(offset.to_le_bytes());
        file.extend(MLLM_TYPE_F32.to_le_bytes());
        offset += data.len() as u64;
    }
    for (_, data) in &tensors {
        file.extend(data);
    }
    std::fs::write(out, file).unwrap();
}
