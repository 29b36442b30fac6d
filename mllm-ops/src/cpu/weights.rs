//! Weights bound to CPU ops: zero-copy slices of the mapped file when the
//! dtype and alignment allow, owned copies otherwise. Block-quantized
//! weights are bytes, so they are always read in place.

use half::{bf16, f16};
use mllm_core::file::TensorData;
use mllm_core::weights::WeightSource;
use mllm_core::{DType, Error, Result};

use crate::cpu::kernels::packed::{PackedQ4, GROUP_ROWS};
use crate::cpu::kernels::packed_q8::PackedQ8;
use crate::cpu::kernels::qmatmul::QuantMatrix;
use crate::quant::QuantType;

/// A borrowed weight of one of the float dtypes the kernels read.
#[derive(Clone, Copy)]
pub enum FloatSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl FloatSlice<'_> {
    /// Number of values.
    pub fn values(&self) -> usize {
        match self {
            FloatSlice::F32(w) => w.len(),
            FloatSlice::F16(w) => w.len(),
            FloatSlice::BF16(w) => w.len(),
        }
    }
}

/// A float weight matrix or table (f32, f16 or bf16).
pub enum FloatWeight {
    /// Read in place from the memory map.
    Mapped(TensorData),
    /// The file's bytes were not aligned for the element type: a copy.
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl FloatWeight {
    /// Binds `name` with `shape`; fails on dtypes the float kernels cannot read.
    pub fn load(weights: &dyn WeightSource, name: &str, shape: &[usize], op: &str) -> Result<Self> {
        FloatWeight::from_data(weights.weight(name, shape)?, op)
    }

    /// Binds loaded tensor data; fails on dtypes the float kernels cannot read.
    fn from_data(data: TensorData, op: &str) -> Result<Self> {
        let name = data.name();
        let aligned = match data.dtype() {
            DType::F32 => bytemuck::try_cast_slice::<u8, f32>(data.bytes()).is_ok(),
            DType::F16 | DType::BF16 => bytemuck::try_cast_slice::<u8, u16>(data.bytes()).is_ok(),
            other => {
                return Err(Error::UnsupportedDType(format!(
                    "{op}: weight '{name}' has dtype {other}, which this op does not support on the CPU"
                )))
            }
        };
        if aligned {
            return Ok(FloatWeight::Mapped(data));
        }
        let bytes = data.bytes();
        Ok(match data.dtype() {
            DType::F32 => FloatWeight::F32(bytemuck::pod_collect_to_vec(bytes)),
            DType::F16 => FloatWeight::F16(bytemuck::pod_collect_to_vec(bytes)),
            _ => FloatWeight::BF16(bytemuck::pod_collect_to_vec(bytes)),
        })
    }

    /// The elements as a typed slice.
    pub fn slice(&self) -> FloatSlice<'_> {
        match self {
            FloatWeight::Mapped(d) => {
                // Alignment and length were checked when the weight was bound.
                let bytes = d.bytes();
                match d.dtype() {
                    DType::F32 => FloatSlice::F32(bytemuck::cast_slice(bytes)),
                    DType::F16 => FloatSlice::F16(bytemuck::cast_slice(bytes)),
                    _ => FloatSlice::BF16(bytemuck::cast_slice(bytes)),
                }
            }
            FloatWeight::F32(v) => FloatSlice::F32(v),
            FloatWeight::F16(v) => FloatSlice::F16(v),
            FloatWeight::BF16(v) => FloatSlice::BF16(v),
        }
    }
}

/// A borrowed weight matrix or table in any dtype the linear and embedding
/// kernels read.
#[derive(Clone, Copy)]
pub enum MatrixSlice<'a> {
    /// f32, f16 or bf16 elements.
    Float(FloatSlice<'a>),
    /// Rows of quantized blocks.
    Quant(QuantMatrix<'a>),
}

/// A `[rows, cols]` weight matrix or table: a [`FloatWeight`], or one of the
/// block-quantized formats of [`QuantType`] read in place from the map.
pub enum MatrixWeight {
    /// f32, f16 or bf16.
    Float(FloatWeight),
    /// Quantized blocks, validated when bound (`cols` is a whole number of
    /// blocks and the bytes match the shape).
    Quant {
        data: TensorData,
        qt: QuantType,
        rows: usize,
        cols: usize,
    },
}

impl MatrixWeight {
    /// Binds `name` with shape `[rows, cols]`; fails with
    /// [`Error::UnsupportedDType`] naming `op`, the weight and its dtype when
    /// the dtype is not f32, f16, bf16 or a [`QuantType`], or when
    /// a quantized weight's rows are not whole blocks.
    pub fn load(
        weights: &dyn WeightSource,
        name: &str,
        [rows, cols]: [usize; 2],
        op: &str,
    ) -> Result<Self> {
        MatrixWeight::from_data(weights.weight(name, &[rows, cols])?, [rows, cols], op)
    }

    /// Binds loaded tensor data of shape `[rows, cols]` (see [`MatrixWeight::load`]).
    fn from_data(data: TensorData, [rows, cols]: [usize; 2], op: &str) -> Result<Self> {
        let dtype = data.dtype();
        let name = data.name().to_string();
        if let Some(qt) = QuantType::from_dtype(dtype) {
            QuantMatrix::new(qt, data.bytes(), rows, cols).map_err(|e| {
                Error::UnsupportedDType(format!("{op}: weight '{name}' of dtype {dtype}: {e}"))
            })?;
            return Ok(MatrixWeight::Quant {
                data,
                qt,
                rows,
                cols,
            });
        }
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => {
                Ok(MatrixWeight::Float(FloatWeight::from_data(data, op)?))
            }
            other => {
                let quantized: Vec<&str> =
                    QuantType::ALL.iter().map(|q| q.dtype().name()).collect();
                Err(Error::UnsupportedDType(format!(
                    "{op}: weight '{name}' has dtype {other}, which this op does not support on \
                     the CPU (supported: f32, f16, bf16, {}, and for linear and embedding \
                     layers q4_packed and q8_0_packed)",
                    quantized.join(", ")
                )))
            }
        }
    }

    /// Drops the mapped bytes of the weight from memory (see
    /// [`TensorData::release_pages`]); for a weight that was copied into a
    /// kernel's own layout. Nothing for a weight held as a copy.
    pub fn release_pages(&self) {
        match self {
            MatrixWeight::Quant { data, .. } | MatrixWeight::Float(FloatWeight::Mapped(data)) => {
                data.release_pages()
            }
            MatrixWeight::Float(_) => {}
        }
    }

    /// [`MatrixWeight::release_pages`] for the bytes `range` of the
    /// weight only.
    pub fn release_range(&self, range: std::ops::Range<usize>) {
        match self {
            MatrixWeight::Quant { data, .. } | MatrixWeight::Float(FloatWeight::Mapped(data)) => {
                data.release_range(range)
            }
            MatrixWeight::Float(_) => {}
        }
    }

    /// Whether the weight is read from the memory map (not a copy).
    pub fn is_mapped(&self) -> bool {
        matches!(
            self,
            MatrixWeight::Quant { .. } | MatrixWeight::Float(FloatWeight::Mapped(_))
        )
    }

    /// The weight as a typed view.
    pub fn slice(&self) -> MatrixSlice<'_> {
        match self {
            MatrixWeight::Float(w) => MatrixSlice::Float(w.slice()),
            MatrixWeight::Quant {
                data,
                qt,
                rows,
                cols,
            } => MatrixSlice::Quant(QuantMatrix::from_checked(*qt, data.bytes(), *rows, *cols)),
        }
    }
}

/// Loads a small vector (norm scale, bias) as owned f32 values.
pub fn load_f32_vector(weights: &dyn WeightSource, name: &str, len: usize) -> Result<Vec<f32>> {
    let w = FloatWeight::load(weights, name, &[len], "vector")?;
    Ok(match w.slice() {
        FloatSlice::F32(s) => s.to_vec(),
        FloatSlice::F16(s) => s.iter().map(|x| x.to_f32()).collect(),
        FloatSlice::BF16(s) => s.iter().map(|x| x.to_f32()).collect(),
    })
}

/// A weight stored in one of mllm-rs's packed layouts (`q4_packed`,
/// `q8_0_packed`), read in place from the mapped file.
pub enum PackedMatrix {
    /// Q4_0 / Q4_1 rows in groups of eight.
    Q4(PackedQ4),
    /// Q8_0 rows in groups of eight.
    Q8(PackedQ8),
}

impl PackedMatrix {
    /// Row `r` as f32 values (`out` holds a row), the values of the
    /// unpacked type.
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let g = r / GROUP_ROWS;
        match self {
            PackedMatrix::Q4(m) => PackedQ4::unpack_row(m.groups(g, 1), r % GROUP_ROWS, out),
            PackedMatrix::Q8(m) => PackedQ8::unpack_row(m.groups(g, 1), r % GROUP_ROWS, out),
        }
    }
}

/// A `[rows, cols]` weight as the linear and embedding ops bind it: packed
/// in the file, or anything [`MatrixWeight`] reads.
pub enum AnyMatrix {
    /// Stored in a packed layout.
    Packed(PackedMatrix),
    /// Stored in a plain layout.
    Plain(MatrixWeight),
}

impl AnyMatrix {
    /// The weight when it is stored in a plain layout.
    pub(crate) fn plain(&self) -> Option<&MatrixWeight> {
        match self {
            AnyMatrix::Plain(w) => Some(w),
            AnyMatrix::Packed(_) => None,
        }
    }

    /// [`AnyMatrix::plain`], by value.
    pub(crate) fn into_plain(self) -> Option<MatrixWeight> {
        match self {
            AnyMatrix::Plain(w) => Some(w),
            AnyMatrix::Packed(_) => None,
        }
    }

    /// Binds `name` with shape `[rows, cols]` (errors as for
    /// [`MatrixWeight::load`], and for packed weights whose shape is not
    /// whole groups and blocks).
    pub fn load(
        weights: &dyn WeightSource,
        name: &str,
        shape: [usize; 2],
        op: &str,
    ) -> Result<Self> {
        let data = weights.weight(name, &shape)?;
        let named = |e: Error| match e {
            Error::InvalidInput(m) => Error::InvalidInput(format!("{op}: {m}")),
            other => other,
        };
        Ok(match data.dtype() {
            DType::Q4Packed => AnyMatrix::Packed(PackedMatrix::Q4(
                PackedQ4::mapped(data, shape).map_err(named)?,
            )),
            DType::Q8Packed => AnyMatrix::Packed(PackedMatrix::Q8(
                PackedQ8::mapped(data, shape).map_err(named)?,
            )),
            _ => AnyMatrix::Plain(MatrixWeight::from_data(data, shape, op)?),
        })
    }
}
