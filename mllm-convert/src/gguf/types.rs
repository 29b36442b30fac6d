//! ggml tensor types as numbered in GGUF, and the ones mllm keeps as stored.

use mllm_core::DType;

/// The name of a ggml tensor type id (`"q5_k"`), or `None` for an id this
/// build does not know.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "f32",
        1 => "f16",
        2 => "q4_0",
        3 => "q4_1",
        6 => "q5_0",
        7 => "q5_1",
        8 => "q8_0",
        9 => "q8_1",
        10 => "q2_k",
        11 => "q3_k",
        12 => "q4_k",
        13 => "q5_k",
        14 => "q6_k",
        15 => "q8_k",
        16 => "iq2_xxs",
        17 => "iq2_xs",
        18 => "iq3_xxs",
        19 => "iq1_s",
        20 => "iq4_nl",
        21 => "iq3_s",
        22 => "iq2_s",
        23 => "iq4_xs",
        24 => "i8",
        25 => "i16",
        26 => "i32",
        27 => "i64",
        28 => "f64",
        29 => "iq1_m",
        30 => "bf16",
        34 => "tq1_0",
        35 => "tq2_0",
        39 => "mxfp4",
        _ => return None,
    })
}

/// `q5_k (13)`, or `unknown type 99` for ids without a name.
pub fn describe_ggml_type(id: u32) -> String {
    match ggml_type_name(id) {
        Some(name) => format!("{name} ({id})"),
        None => format!("unknown type {id}"),
    }
}

/// The mllm dtype that stores a ggml type byte for byte, for the types the
/// importer keeps: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
/// Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS.
///
/// mllm's quantized types use ggml's block layouts, so these tensors are
/// copied unchanged.
pub fn dtype_for_ggml(id: u32) -> Option<DType> {
    Some(match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        10 => DType::Q2K,
        11 => DType::Q3K,
        12 => DType::Q4K,
        13 => DType::Q5K,
        14 => DType::Q6K,
        20 => DType::IQ4NL,
        23 => DType::IQ4XS,
        30 => DType::BF16,
        _ => return None,
    })
}

/// The ggml type ids that [`dtype_for_ggml`] maps, for messages.
pub const KEPT_TYPES: &str =
    "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl and iq4_xs";
