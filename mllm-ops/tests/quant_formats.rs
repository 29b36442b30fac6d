//! The quantized formats against llama.cpp's reference (`gguf` Python
//! package) and their quantization error on random normal data.

use mllm_core::DType;
use mllm_ops::quant::{dequantize, quantize, QuantType};

/// The formats whose quantizer rounds each value to nearest with one scale
/// (and offset) per block, as gguf-py's does.
const ROUND_TO_NEAREST: [DType; 5] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
];

/// Reads `tests/data/<name>.blocks` and `tests/data/<name>.f32`.
fn vectors(name: &str) -> (Vec<u8>, Vec<f32>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let blocks = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
    let values = std::fs::read(dir.join(format!("{name}.f32"))).unwrap();
    let values = values
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (blocks, values)
}

/// Dequantization is bit-exact against gguf-py on random blocks (scales of
/// both signs, one subnormal, every other byte random).
#[test]
fn dequantize_matches_gguf_reference() {
    for q in QuantType::ALL {
        let (blocks, want) = vectors(q.dtype().name());
        assert_eq!(blocks.len() / q.block_bytes() * q.block_len(), want.len());
        assert!(blocks.len() >= 2 * q.block_bytes(), "{q}: too few blocks");
        let mut got = vec![f32::NAN; want.len()];
        dequantize(q.dtype(), &blocks, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{q} value {i}: {g} vs {w}");
        }
    }
}

/// The round-to-nearest quantizers produce gguf-py's bytes exactly on
/// random normal blocks, an all-zero block and a constant one.
#[test]
fn quantize_matches_gguf_reference() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for dtype in ROUND_TO_NEAREST {
        let read = |ext: &str| std::fs::read(dir.join(format!("{dtype}.{ext}"))).unwrap();
        let input: Vec<f32> = read("input")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let want = read("quantized");
        assert_eq!(want.len(), dtype.bytes_for(input.len()).unwrap());
        let got = quantize(dtype, &input).unwrap();
        let block = dtype.block_bytes();
        for (i, (g, w)) in got.chunks(block).zip(want.chunks(block)).enumerate() {
            assert_eq!(g, w, "{dtype} block {i}");
        }
    }
}

/// A deterministic xorshift64* generator with Box–Muller normals.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((r >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// RMS of the quantization error relative to the RMS of the data.
fn relative_rms_error(dtype: DType, x: &[f32]) -> f64 {
    let bytes = quantize(dtype, x).unwrap();
    assert_eq!(bytes.len(), dtype.bytes_for(x.len()).unwrap());
    let mut y = vec![0.0f32; x.len()];
    dequantize(dtype, &bytes, &mut y).unwrap();
    let err: f64 = x
        .iter()
        .zip(&y)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let sig: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
    (err / sig).sqrt()
}

/// Measured on 64 Ki standard-normal values (seed 7):
/// Q8_0 0.0053, Q4_0 0.0858, Q4_1 0.0785, Q4_K 0.0716, Q6_K 0.0169,
/// Q5_0 0.0427, Q5_1 0.0379, Q5_K 0.0359, Q2_K 0.2704, Q3_K 0.1437,
/// IQ4_NL 0.0740, IQ4_XS 0.0747.
/// The bounds sit a little above those.
#[test]
fn quantization_error_bounds() {
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..65536).map(|_| rng.normal()).collect();
    for (dtype, bound) in [
        (DType::Q8_0, 0.0056),
        (DType::Q4_0, 0.090),
        (DType::Q4_1, 0.083),
        (DType::Q4K, 0.075),
        (DType::Q6K, 0.018),
        (DType::Q5_0, 0.045),
        (DType::Q5_1, 0.040),
        (DType::Q5K, 0.038),
        (DType::Q2K, 0.28),
        (DType::Q3K, 0.15),
        (DType::IQ4NL, 0.078),
        (DType::IQ4XS, 0.078),
    ] {
        let e = relative_rms_error(dtype, &x);
        eprintln!("{dtype}: relative RMS error {e:.4}");
        assert!(e <= bound, "{dtype}: relative RMS error {e} above {bound}");
    }
    // Scaled data gives the same relative error (scales adapt per block).
    let small: Vec<f32> = x.iter().map(|v| v * 1e-3).collect();
    assert!(relative_rms_error(DType::Q4K, &small) <= 0.075);
    assert!(relative_rms_error(DType::Q6K, &small) <= 0.018);
    assert!(relative_rms_error(DType::Q5K, &small) <= 0.038);
    assert!(relative_rms_error(DType::IQ4XS, &small) <= 0.078);
}

/// Quantizing already-dequantized data almost reproduces it for the
/// round-to-nearest formats (only f16 rounding of the scales moves values).
#[test]
fn requantizing_is_nearly_stable() {
    let mut rng = Rng(11);
    let x: Vec<f32> = (0..4096).map(|_| rng.normal()).collect();
    for dtype in ROUND_TO_NEAREST {
        let mut y = vec![0.0f32; x.len()];
        dequantize(dtype, &quantize(dtype, &x).unwrap(), &mut y).unwrap();
        let e = relative_rms_error(dtype, &y);
        assert!(e < 0.01, "{dtype}: {e}");
    }
}
