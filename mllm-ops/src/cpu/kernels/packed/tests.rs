use std::ops::Range;

use half::f16;
use rayon::ThreadPool;

use super::q4::{group_dot, Q4Format};
use super::*;
use crate::cpu::kernels::qact::{ActivationScratch, Q16Act, Q16Row, BYTE, WIDE};
use crate::cpu::kernels::qkernel::tests::{kernel_or_skip, random_blocks};
use crate::cpu::kernels::qkernel::QuantKernel;
use crate::cpu::kernels::qkernel::{QuantPath, SimdLevel};
use crate::cpu::kernels::qmatmul::{QuantMatrix, Split};
use crate::cpu::kernels::test_util::{assert_within, bits, linear_reference, pool1, pool2, Rng};
use crate::quant::QuantType;

/// `quantize_rows` gives every row the planes, scales and sums of the
/// row quantized alone, one `qact::row_stride` after the other, on one
/// thread and split over two, with one scale per block and, where the
/// rows are whole super-blocks, per super-block.
#[test]
fn quantize_rows_gives_each_row_as_alone() {
    use crate::cpu::kernels::qact::SUPER_BLOCK;
    let mut rng = Rng::new(41);
    let k = kernel_or_skip(QuantPath::Int8Packed, SimdLevel::Scalar).unwrap();
    let scratch = ActivationScratch::default();
    for (rows, in_f) in [(20, 2048), (3, 576), (40, 1536)] {
        let x = rng.vec(rows * in_f, 2.0);
        let scales = [BLOCK, SUPER_BLOCK].into_iter();
        for per_scale in scales.filter(|&p| in_f.is_multiple_of(p)) {
            for pool in [pool1(), pool2()] {
                let split = Split::new(&pool, usize::MAX);
                let mut seen = 0;
                quantize_rows::<WIDE>(k, (&x, in_f, per_scale), &split, &scratch, |xs| {
                    seen = xs.len();
                    let stride = crate::cpu::kernels::qact::row_stride(in_f);
                    for (t, got) in xs.iter().enumerate() {
                        let row = &x[t * in_f..][..in_f];
                        let alone = Q16Act::<WIDE>::quantize_per(row, per_scale);
                        let want = alone.row();
                        let what = format!("row {t} of {rows}, per {per_scale}");
                        assert_eq!((got.hi, got.lo), (want.hi, want.lo), "{what}");
                        assert_eq!((bits(got.d), bits(got.s)), (bits(want.d), bits(want.s)));
                        assert_eq!(got.sums, want.sums, "{what}");
                        let from_first = got.hi.as_ptr() as usize - xs[0].hi.as_ptr() as usize;
                        assert_eq!(from_first, t * stride);
                    }
                });
                assert_eq!(seen, rows);
            }
        }
    }
}

/// Checks the row ranges a packer reported through its progress
/// callback for a matrix of `rows` rows of `row_bytes` source bytes:
/// more than two, in whole groups, of at most about `RELEASE_BYTES` of
/// source each, and together every row exactly once.
pub(crate) fn check_copied_ranges(mut seen: Vec<Range<usize>>, rows: usize, row_bytes: usize) {
    seen.sort_by_key(|r| r.start);
    assert!(seen.len() > 2, "{seen:?}");
    assert_eq!(seen.first().map(|r| r.start), Some(0));
    assert_eq!(seen.last().map(|r| r.end), Some(rows));
    for pair in seen.windows(2) {
        assert_eq!(pair[0].end, pair[1].start, "{seen:?}");
    }
    for r in &seen {
        assert!(
            r.start.is_multiple_of(GROUP_ROWS) && r.end > r.start,
            "{r:?}"
        );
        assert!(
            r.len() * row_bytes <= RELEASE_BYTES + GROUP_ROWS * row_bytes,
            "{r:?}"
        );
    }
}

/// Stacked rows map to the parts that hold them: whole ranges within a
/// part, ranges split where parts meet, empty parts skipped.
#[test]
fn stacked_rows_are_found_in_their_parts() {
    let parts = [8, 0, 16, 8];
    let ranges = |r: Range<usize>| stacked_ranges(parts, r).collect::<Vec<_>>();
    assert_eq!(ranges(0..8), [(0, 0..8)]);
    assert_eq!(ranges(4..12), [(0, 4..8), (2, 0..4)]);
    assert_eq!(ranges(6..32), [(0, 6..8), (2, 0..16), (3, 0..8)]);
    assert_eq!(ranges(24..32), [(3, 0..8)]);
    assert_eq!(ranges(5..5), []);
    assert_eq!(ranges(32..40), []);
    assert_eq!(stacked_row(parts, 7), (0, 7));
    assert_eq!(stacked_row(parts, 8), (2, 0));
    assert_eq!(stacked_row(parts, 31), (3, 7));
    let past = std::panic::catch_unwind(|| stacked_row(parts, 32));
    assert!(past.is_err(), "row 32 is past the stack");
}

/// Packing with a progress callback reports every row once (see
/// [`check_copied_ranges`]) and gives the bytes of packing without.
#[test]
fn packing_reports_the_rows_it_copied() {
    let mut rng = Rng::new(57);
    let (rows, cols) = (8 * 500, 4 * BLOCK);
    let qt = QuantType::Q4_1;
    let w = random_blocks(&mut rng, qt, rows * cols / BLOCK);
    let m = QuantMatrix::new(qt, &w, rows, cols).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let record = |r: Range<usize>| seen.lock().unwrap().push(r);
    let p = pool2()
        .install(|| PackedQ4::pack_with(&[m], None, &record))
        .unwrap();
    check_copied_ranges(seen.into_inner().unwrap(), rows, m.row_bytes());
    assert!(p.bytes() == PackedQ4::pack(&m).unwrap().bytes());
}

/// Matrices packed as one stack give the bytes of their rows packed
/// as one matrix, report the stacked rows they copied, and are refused
/// with named errors when they differ in type or width or a part's
/// rows are not whole groups.
#[test]
fn stacked_sources_pack_as_one_matrix() {
    let mut rng = Rng::new(58);
    let (cols, qt) = (4 * BLOCK, QuantType::Q4_0);
    let rows = [8 * 300, 16, 8 * 200];
    let blocks: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| random_blocks(&mut rng, qt, r * cols / BLOCK))
        .collect();
    let parts: Vec<QuantMatrix<'_>> = blocks
        .iter()
        .zip(rows)
        .map(|(b, r)| QuantMatrix::new(qt, b, r, cols).unwrap())
        .collect();
    let all = blocks.concat();
    let total = rows.iter().sum();
    let one = QuantMatrix::new(qt, &all, total, cols).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let record = |r: Range<usize>| seen.lock().unwrap().push(r);
    let p = pool2()
        .install(|| PackedQ4::pack_with(&parts, None, &record))
        .unwrap();
    check_copied_ranges(seen.into_inner().unwrap(), total, one.row_bytes());
    assert!(p.bytes() == PackedQ4::pack(&one).unwrap().bytes());

    let refused = |parts: &[QuantMatrix<'_>], want: &str| {
        let err = PackedQ4::pack_with(parts, None, &|_| {}).err().unwrap();
        assert!(err.to_string().contains(want), "{err}");
    };
    let other = random_blocks(&mut rng, QuantType::Q4_1, 8 * cols / BLOCK);
    let q4_1 = QuantMatrix::new(QuantType::Q4_1, &other, 8, cols).unwrap();
    refused(&[parts[1], q4_1], "share a type and a width");
    let narrow = QuantMatrix::new(qt, &blocks[1][..blocks[1].len() / 2], 16, cols / 2).unwrap();
    refused(&[parts[1], narrow], "share a type and a width");
    let odd = QuantMatrix::new(qt, &blocks[1][..blocks[1].len() / 16 * 12], 12, cols).unwrap();
    refused(&[parts[1], odd], "12 rows");
    refused(&[], "no matrix");
}

/// The integer paths whose packed 4-, 5- and 6-bit kernels differ:
/// 16-bit and 8-bit activation rows.
pub(crate) const PATHS: [QuantPath; 2] = [QuantPath::Int16Activations, QuantPath::Int8Packed];

/// Checks that each of the `rows` rows of `cols` values that `unpack`
/// reads from its packed group (`groups(g)`) equals, bit for bit, what
/// `qt`'s dequantizer gives the raw blocks `w`.
pub(crate) fn check_unpacked_rows<'g>(
    qt: QuantType,
    w: &[u8],
    [rows, cols]: [usize; 2],
    groups: &dyn Fn(usize) -> &'g [u8],
    unpack: fn(&[u8], usize, &mut [f32]),
) {
    let mut want = vec![0.0f32; rows * cols];
    qt.dequantize_blocks(w, &mut want);
    for r in 0..rows {
        let mut got = vec![f32::NAN; cols];
        unpack(groups(r / GROUP_ROWS), r % GROUP_ROWS, &mut got);
        assert_eq!(got, want[r * cols..(r + 1) * cols], "{qt} row {r}");
    }
}

/// Each row unpacked from the packed layout has exactly the values the
/// Q4_0 / Q4_1 dequantizer gives the unpacked row.
#[test]
fn unpacked_rows_equal_the_dequantized_rows() {
    let mut rng = Rng::new(43);
    for qt in [QuantType::Q4_0, QuantType::Q4_1] {
        let (rows, cols) = (24, 3 * BLOCK);
        let w = random_blocks(&mut rng, qt, rows * cols / BLOCK);
        let p = PackedQ4::pack(&QuantMatrix::new(qt, &w, rows, cols).unwrap()).unwrap();
        let groups = |g| p.groups(g, 1);
        check_unpacked_rows(qt, &w, [rows, cols], &groups, PackedQ4::unpack_row);
    }
}

/// Checks one packed format's portable group product against f64: for
/// the matrix `w` (`rows` rows of type `qt`, as wide as `x`) and the
/// activation row `x`, `group_dot(g)` gives group `g`'s eight outputs, and
/// each must equal the f64 dot of its row's dequantized weights with the
/// dequantized activations, within 1e-5 of the products' magnitude.
pub(crate) fn check_group_dots<const SHIFT: u32>(
    qt: QuantType,
    w: &[u8],
    rows: usize,
    x: &Q16Row<'_, SHIFT>,
    what: &str,
    group_dot: impl Fn(usize) -> [f32; GROUP_ROWS],
) {
    let cols = x.hi.len();
    let xf: Vec<f64> = (0..cols)
        .map(|i| x.value(i) as f64 * x.d[i / BLOCK] as f64)
        .collect();
    let mut wf = vec![0.0f32; rows * cols];
    qt.dequantize_blocks(w, &mut wf);
    for g in 0..rows / GROUP_ROWS {
        for (r, got) in group_dot(g).into_iter().enumerate() {
            let row = &wf[(g * GROUP_ROWS + r) * cols..][..cols];
            let want: f64 = row.iter().zip(&xf).map(|(&a, &b)| a as f64 * b).sum();
            let mag: f64 = row
                .iter()
                .zip(&xf)
                .map(|(&a, &b)| (a as f64 * b).abs())
                .sum();
            assert!((got as f64 - want).abs() <= 1e-5 * mag, "{what}: {g} {r}");
        }
    }
}

/// Packing keeps every value: the portable packed dot with wide
/// activations equals the f64 dot of each unpacked row's dequantized
/// weights with the dequantized activations.
#[test]
fn packed_dot_equals_row_dot() {
    let mut rng = Rng::new(41);
    for qt in [QuantType::Q4_0, QuantType::Q4_1] {
        let (rows, nb) = (16, 5);
        let w = random_blocks(&mut rng, qt, rows * nb);
        let m = QuantMatrix::new(qt, &w, rows, nb * BLOCK).unwrap();
        let p = PackedQ4::pack(&m).unwrap();
        let x = Q16Act::<WIDE>::quantize(&rng.vec(nb * BLOCK, 1.0));
        let xr = x.row();
        check_group_dots(qt, &w, rows, &xr, &qt.to_string(), |g| {
            let mut out = [[0.0; GROUP_ROWS]];
            group_dot(p.groups(g, 1), &[xr], &mut out);
            out[0]
        });
    }
}

#[test]
fn what_cannot_be_packed_is_an_error() {
    let w = vec![0u8; 7 * 20];
    let m = QuantMatrix::new(QuantType::Q4_1, &w, 7, 32).unwrap();
    let err = PackedQ4::pack(&m).err().unwrap();
    assert!(err.to_string().contains("7 rows"), "{err}");
    let w = vec![0u8; 8 * 34];
    let m = QuantMatrix::new(QuantType::Q8_0, &w, 8, 32).unwrap();
    let err = PackedQ4::pack(&m).err().unwrap();
    assert!(err.to_string().contains("q8_0"), "{err}");
    let mut w = vec![0u8; 8 * 18];
    w[..2].copy_from_slice(&f16::from_f32(10000.0).to_le_bytes());
    let m = QuantMatrix::new(QuantType::Q4_0, &w, 8, 32).unwrap();
    let err = PackedQ4::pack(&m).err().unwrap();
    assert!(err.to_string().contains("too large"), "{err}");
}

/// A packed linear layer run on raw blocks: `(kernel, weights, x, rows,
/// bias, y, pool)`, packing the weights itself.
pub(crate) type PackedLinear =
    dyn Fn(QuantKernel, &QuantMatrix<'_>, &[f32], usize, Option<&[f32]>, &mut [f32], &ThreadPool);

/// Checks `linear` on `path` at every level and thread count against
/// the f64 product of the dequantized weights (`qt` blocks made by
/// `blocks`) with the activations as the path sees them (the f32
/// values, or their 8-bit round trip on [`QuantPath::Int8Packed`] with
/// one scale per block of 32),
/// within `1e-4 · (Σ|x·w| + |b|)`, for each `(rows, blocks per row,
/// out_f)` case, with a bias on odd row counts.
pub(crate) fn check_packed_linear(
    path: QuantPath,
    rng: &mut Rng,
    qt: QuantType,
    blocks: &dyn Fn(&mut Rng, usize) -> Vec<u8>,
    cases: &[(usize, usize, usize)],
    linear: &PackedLinear,
) {
    check_packed_linear_per(path, rng, (qt, BLOCK), blocks, cases, linear)
}

/// [`check_packed_linear`] for a layer whose 8-bit activation rows
/// have one scale per `per_scale` values.
pub(crate) fn check_packed_linear_per(
    path: QuantPath,
    rng: &mut Rng,
    (qt, per_scale): (QuantType, usize),
    blocks: &dyn Fn(&mut Rng, usize) -> Vec<u8>,
    cases: &[(usize, usize, usize)],
    linear: &PackedLinear,
) {
    for level in SimdLevel::FASTEST_FIRST {
        let Some(k) = kernel_or_skip(path, level) else {
            continue;
        };
        for pool in [pool1(), pool2()] {
            for &(rows, nb, out_f) in cases {
                let in_f = nb * BLOCK;
                let w = blocks(rng, out_f * nb);
                let mut wf = vec![0.0; out_f * in_f];
                qt.dequantize_blocks(&w, &mut wf);
                let m = QuantMatrix::new(qt, &w, out_f, in_f).unwrap();
                let x = rng.vec(rows * in_f, 1.0);
                let b = rng.vec(out_f, 1.0);
                let bias = (rows % 2 == 1).then_some(&b[..]);
                let mut y = vec![f32::NAN; rows * out_f];
                linear(k, &m, &x, rows, bias, &mut y, &pool);
                let seen = match path {
                    QuantPath::Int8Packed => eight_bit_round_trip(&x, per_scale),
                    _ => x,
                };
                let (want, mag) = linear_reference(&seen, rows, in_f, &wf, out_f, bias);
                let what = format!("{path:?} {level:?} {qt} rows={rows} out={out_f}");
                assert_within(&y, &want, &mag, 1e-4, &what);
            }
        }
    }
}

/// `x` quantized to 8 bits with one scale per `per_scale` values and
/// back.
fn eight_bit_round_trip(x: &[f32], per_scale: usize) -> Vec<f32> {
    let q = Q16Act::<BYTE>::quantize_per(x, per_scale);
    let r = q.row();
    r.hi.iter()
        .enumerate()
        .map(|(i, &q)| q as f32 * r.d[i / BLOCK])
        .collect()
}

/// The packed linear layer matches the reference (see
/// [`check_packed_linear`]) for one row (decode), row counts that do
/// and do not fill the token tile, and enough values to quantize in
/// parallel.
#[test]
fn packed_linear_matches_reference() {
    let mut rng = Rng::new(42);
    let cases = [
        (1, 3, 8),
        (1, 18, 200),
        (5, 7, 64),
        (70, 9, 136),
        (300, 2, 16),
        (130, 32, 16),
    ];
    for (qt, path) in [QuantType::Q4_0, QuantType::Q4_1]
        .into_iter()
        .flat_map(|qt| PATHS.map(|p| (qt, p)))
    {
        let blocks = |rng: &mut Rng, n| random_blocks(rng, qt, n);
        check_packed_linear(
            path,
            &mut rng,
            qt,
            &blocks,
            &cases,
            &|k, m, x, rows, b, y, pool| {
                packed_linear(
                    k,
                    x,
                    rows,
                    &PackedQ4::pack(m).unwrap(),
                    b,
                    y,
                    pool,
                    &ActivationScratch::default(),
                )
            },
        );
    }
}

/// A packed linear layer bound to its weights and bias: `(kernel, x,
/// rows, y, pool)`.
pub(crate) type BoundLinear<'a> = dyn Fn(QuantKernel, &[f32], usize, &mut [f32], &ThreadPool) + 'a;

/// Batch invariance on `path` at every level this CPU runs: each of
/// the `rows` rows of `x` gets from the whole batch on two threads
/// exactly the `out_f` outputs it gets alone on one, whatever shares
/// its token tile or row block and however the groups are split over
/// threads. With `portable_bits`, every level's batch also equals the
/// portable kernel's bit for bit.
pub(crate) fn check_rows_alone(
    path: QuantPath,
    linear: &BoundLinear<'_>,
    x: &[f32],
    rows: usize,
    out_f: usize,
    portable_bits: bool,
    what: &str,
) {
    let in_f = x.len() / rows;
    let scalar = kernel_or_skip(path, SimdLevel::Scalar).unwrap();
    let mut portable = vec![f32::NAN; rows * out_f];
    linear(scalar, x, rows, &mut portable, &pool1());
    for level in SimdLevel::FASTEST_FIRST {
        let Some(k) = kernel_or_skip(path, level) else {
            continue;
        };
        let mut all = vec![f32::NAN; rows * out_f];
        linear(k, x, rows, &mut all, &pool2());
        if portable_bits {
            assert_eq!(
                all, portable,
                "{what}: {level:?} differs from the portable kernel"
            );
        }
        for (t, want) in all.chunks_exact(out_f).enumerate() {
            let mut one = vec![f32::NAN; out_f];
            linear(k, &x[t * in_f..(t + 1) * in_f], 1, &mut one, &pool1());
            assert_eq!(one, want, "{what}: {level:?} row {t} of {rows}");
        }
    }
}

/// Batch invariance on both paths (see [`check_rows_alone`]) of the
/// packed Q4 layer.
#[test]
fn each_row_equals_the_row_alone() {
    let mut rng = Rng::new(43);
    for (qt, path) in [QuantType::Q4_0, QuantType::Q4_1]
        .into_iter()
        .flat_map(|qt| PATHS.map(|p| (qt, p)))
    {
        for &(rows, nb, out_f) in &[(3, 7, 64), (6, 18, 200), (131, 4, 24)] {
            let in_f = nb * BLOCK;
            let w = random_blocks(&mut rng, qt, out_f * nb);
            let p = PackedQ4::pack(&QuantMatrix::new(qt, &w, out_f, in_f).unwrap()).unwrap();
            let x = rng.vec(rows * in_f, 1.0);
            let b = rng.vec(out_f, 1.0);
            let linear: &BoundLinear<'_> = &|k, x, rows, y, pool| {
                packed_linear(
                    k,
                    x,
                    rows,
                    &p,
                    Some(&b),
                    y,
                    pool,
                    &ActivationScratch::default(),
                )
            };
            check_rows_alone(path, linear, &x, rows, out_f, false, &qt.to_string());
        }
    }
}

/// Decode's row runs of packed Q4 groups (see [`check_row_runs`]), for
/// 16-bit and 8-bit rows, at SmolLM2's width and an odd one.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_row_run_gives_each_group_its_own_bits() {
    let mut rng = Rng::new(47);
    for qt in [QuantType::Q4_0, QuantType::Q4_1] {
        for (groups_n, nb) in [(5, 18), (3, 7)] {
            let (rows, cols) = (groups_n * GROUP_ROWS, nb * BLOCK);
            let w = random_blocks(&mut rng, qt, rows * nb);
            let p = PackedQ4::pack(&QuantMatrix::new(qt, &w, rows, cols).unwrap()).unwrap();
            let groups = (p.groups(0, groups_n), groups_n);
            let x = rng.vec(cols, 3.0);
            let wide = Q16Act::<WIDE>::quantize(&x);
            check_row_runs::<Q4Format<WIDE>>(groups, wide.row(), &format!("{qt} 16-bit"));
            let byte = Q16Act::<BYTE>::quantize(&x);
            check_row_runs::<Q4Format<BYTE>>(groups, byte.row(), &format!("{qt} 8-bit"));
        }
    }
}

/// Only the first tile of rows over each span of groups is told that
/// its weights come from memory (and so prefetches them); the other
/// tiles over the span find them in cache. Every tile goes through
/// every pair of groups once, on one thread and on two.
#[test]
fn only_the_first_tile_over_a_span_reads_from_memory() {
    // Groups of half a span: each pair of groups is a span of its own.
    let group_bytes = SPAN_WEIGHT_BYTES / 2;
    let n_groups = 6;
    let weights = vec![0u8; n_groups * group_bytes];
    let groups = |g: usize, n: usize| &weights[g * group_bytes..(g + n) * group_bytes];
    for rows in [1, 4, 10] {
        let xs: Vec<usize> = (0..rows).collect();
        for pool in [pool1(), pool2()] {
            let split = Split::new(&pool, usize::MAX);
            let mut dst = vec![0.0f32; rows * n_groups * GROUP_ROWS];
            let seen = std::sync::Mutex::new(Vec::new());
            group_outputs(
                (&groups, RowOutputs::Each),
                64,
                &xs,
                TILE_TOKENS,
                &split,
                &mut dst,
                |g, xs, out, reads| {
                    let pair = (g.as_ptr() as usize - weights.as_ptr() as usize) / group_bytes;
                    seen.lock()
                        .unwrap()
                        .push((pair, xs[0], g.len() / group_bytes, reads));
                    out.fill([0.0; GROUP_ROWS]);
                },
            );
            let mut seen = seen.into_inner().unwrap();
            seen.sort_by_key(|&(pair, row, ..)| (pair, row));
            let want: Vec<_> = (0..n_groups)
                .step_by(2)
                .flat_map(|pair| (0..rows).step_by(TILE_TOKENS).map(move |row| (pair, row)))
                .map(|(pair, row)| {
                    let reads = if row == 0 {
                        WeightReads::FromMemory
                    } else {
                        WeightReads::FromCache
                    };
                    (pair, row, 2, reads)
                })
                .collect();
            assert_eq!(seen, want, "{rows} rows");
        }
    }
}

/// One activation scratch shared by calls of other widths and row
/// counts, on both paths, gives the bits of a fresh scratch per call:
/// whatever the buffers held from a wider or longer call (or from the
/// other path's planes), the kernels read only what the call wrote.
#[test]
fn a_reused_scratch_gives_the_bits_of_a_fresh_one() {
    use crate::cpu::kernels::packed_q6k::{packed_q6k_linear, PackedQ6K};
    use crate::cpu::kernels::packed_q8::{packed_q8_linear, PackedQ8};
    let mut rng = Rng::new(61);
    let pool = pool2();
    let shared = ActivationScratch::default();
    let cases = [
        (QuantType::Q4_1, 48, 256, 130),
        (QuantType::Q8_0, 24, 96, 3),
        (QuantType::Q6K, 16, 512, 129),
        (QuantType::Q4_1, 16, 64, 1),
        (QuantType::Q8_0, 32, 512, 131),
    ];
    let cases = cases.into_iter().flat_map(|c| PATHS.map(|p| (c, p)));
    for ((qt, out_f, in_f, rows), path) in cases {
        let k = QuantKernel::new(path);
        let w = random_blocks(&mut rng, qt, out_f * in_f / qt.block_len());
        let m = QuantMatrix::new(qt, &w, out_f, in_f).unwrap();
        let x = rng.vec(rows * in_f, 1.0);
        let run = |scratch: &ActivationScratch| {
            let mut y = vec![0.0f32; rows * out_f];
            match qt {
                QuantType::Q4_1 => {
                    let p = PackedQ4::pack(&m).unwrap();
                    packed_linear(k, &x, rows, &p, None, &mut y, &pool, scratch);
                }
                QuantType::Q8_0 => {
                    let p = PackedQ8::pack(&m).unwrap();
                    packed_q8_linear(k, &x, rows, &p, None, &mut y, &pool, scratch);
                }
                _ => {
                    let p = PackedQ6K::pack(&m).unwrap();
                    packed_q6k_linear(k, &x, rows, &p, None, &mut y, &pool, scratch);
                }
            }
            bits(&y)
        };
        let fresh = run(&ActivationScratch::default());
        assert_eq!(
            run(&shared),
            fresh,
            "{qt} {path:?} {out_f}x{in_f}, {rows} rows"
        );
    }
}

/// Checks the group products of format `F` over `groups` (two packed
/// groups): for one group and for both (the two-group kernels) and one
/// to all of the rows `xs` (at most the format's tile), every level of
/// `levels` this CPU runs gives the first such level's bits, whether it
/// prefetches its weights or not, and each level's two-group product
/// each group's own ([`check_pair_equals_groups_alone`]).
pub(crate) fn check_group_products<F: PackedFormat>(
    groups: &[u8],
    xs: &[F::Input<'_>],
    levels: &[SimdLevel],
    what: &str,
) {
    let kernels: Vec<QuantKernel> = levels
        .iter()
        .filter_map(|&l| kernel_or_skip(QuantPath::Int16Activations, l))
        .collect();
    let Some(first) = kernels.first() else {
        return;
    };
    let group_bytes = groups.len() / 2;
    for n in 1..=2 {
        for t in 1..=xs.len() {
            let groups = &groups[..n * group_bytes];
            let mut want = vec![[f32::NAN; GROUP_ROWS]; n * t];
            first.packed_dot::<F>(groups, &xs[..t], &mut want, WeightReads::FromCache);
            for k in &kernels {
                for reads in [WeightReads::FromMemory, WeightReads::FromCache] {
                    let mut got = vec![[f32::NAN; GROUP_ROWS]; n * t];
                    k.packed_dot::<F>(groups, &xs[..t], &mut got, reads);
                    let level = k.level();
                    assert_eq!(
                        got, want,
                        "{what}: {level:?} {reads:?}, {n} groups, {t} rows"
                    );
                }
            }
        }
    }
    for k in &kernels {
        check_pair_equals_groups_alone::<F>(*k, groups, xs, what);
    }
}

/// At the AVX2 level (skipped, with a note, on a CPU without it), one
/// activation row `x` through every run of consecutive groups of
/// `groups` (`groups_n` of them) in one call of `packed_dot` (the
/// format's [`PackedFormat::avx2_row_run`], or pair by pair for a
/// format without one) gets, whether the run prefetches or not, each
/// group's outputs from the one-group kernel ([`PackedFormat::avx2`])
/// bit for bit.
#[cfg(target_arch = "x86_64")]
pub(crate) fn check_row_runs<F: PackedFormat>(
    (groups, groups_n): (&[u8], usize),
    x: F::Input<'_>,
    what: &str,
) {
    let Some(k) = kernel_or_skip(QuantPath::Int16Activations, SimdLevel::Avx2) else {
        return;
    };
    let group_bytes = groups.len() / groups_n;
    let one = std::slice::from_ref(&x);
    let alone: Vec<[f32; GROUP_ROWS]> = groups
        .chunks_exact(group_bytes)
        .map(|group| {
            let mut out = [[f32::NAN; GROUP_ROWS]];
            // SAFETY: the AVX2 level is available (checked above), so
            // this CPU has AVX2, FMA and F16C.
            unsafe { F::avx2(group, one, &mut out, WeightReads::FromCache) };
            out[0]
        })
        .collect();
    for first in 0..groups_n {
        for n in 1..=groups_n - first {
            let run = &groups[first * group_bytes..(first + n) * group_bytes];
            for reads in [WeightReads::FromMemory, WeightReads::FromCache] {
                let mut got = vec![[f32::NAN; GROUP_ROWS]; n];
                k.packed_dot::<F>(run, one, &mut got, reads);
                assert_eq!(
                    got,
                    alone[first..first + n],
                    "{what}: groups {first}..{}, {reads:?}",
                    first + n
                );
            }
        }
    }
}

/// At the AMX level (skipped, with a note, on a CPU without it), the
/// tile product of the groups `groups` (an even number, `groups_n` of
/// them) with the rows `xs` (rows of one buffer, in order; any number,
/// for formats whose tile kernel takes many tiles and the rows after
/// them) is taken, and each row's outputs equal the AVX-512 products
/// of the row alone, bit for bit.
#[cfg(target_arch = "x86_64")]
pub(crate) fn check_tiles_take_rows<F: PackedFormat>(
    (groups, groups_n): (&[u8], usize),
    xs: &[F::Input<'_>],
    what: &str,
) {
    let path = QuantPath::Int16Activations;
    if QuantKernel::with_level(path, SimdLevel::Amx).is_none() {
        eprintln!("{what}: no AMX tiles on this CPU, the tile products were not run");
        return;
    }
    let avx512 = QuantKernel::with_level(path, SimdLevel::Avx512).expect("AMX has AVX-512");
    let (n, group_bytes) = (xs.len(), groups.len() / groups_n);
    let mut got = vec![[f32::NAN; GROUP_ROWS]; groups_n * n];
    // SAFETY: the AMX level is available (checked above): the AVX-512
    // level's features and AMX tiles this process may use.
    let took = unsafe { F::amx_pairs(groups, group_bytes, xs, &mut got) };
    assert!(took, "{what}, {n} rows: tiles taken");
    for (t, x) in xs.iter().enumerate() {
        let mut alone = vec![[f32::NAN; GROUP_ROWS]; groups_n];
        let one = std::slice::from_ref(x);
        avx512.packed_dot::<F>(groups, one, &mut alone, WeightReads::FromCache);
        for (g, want) in alone.iter().enumerate() {
            assert_eq!(got[g * n + t], *want, "{what}: row {t} of {n}, group {g}");
        }
    }
}

/// At the AMX level (skipped, with a note, on a CPU without it), the
/// product of the two packed groups `groups` with the 16 rows `xs`
/// (rows of one buffer, in order) equals the AVX-512 products of each
/// row alone, bit for bit, for the rows in order and reversed (a
/// negative stride), both through the tiles where the format has a tile
/// product ([`PackedFormat::AMX`]), and with two rows swapped (not
/// evenly spaced: the AVX-512 products).
#[cfg(target_arch = "x86_64")]
pub(crate) fn check_tile_products<F: PackedFormat>(groups: &[u8], xs: &[F::Input<'_>], what: &str) {
    let path = QuantPath::Int16Activations;
    let Some(amx) = QuantKernel::with_level(path, SimdLevel::Amx) else {
        eprintln!("{what}: no AMX tiles on this CPU, the tile products were not run");
        return;
    };
    let avx512 = QuantKernel::with_level(path, SimdLevel::Avx512).expect("AMX has AVX-512");
    let n = xs.len();
    assert_eq!(
        n,
        crate::cpu::kernels::simd::amx::TILE_ROWS,
        "{what}: a tile of rows"
    );
    let group_bytes = groups.len() / 2;
    let reads = WeightReads::FromMemory;
    let alone: Vec<[[f32; GROUP_ROWS]; 2]> = xs
        .iter()
        .map(|x| {
            let mut out = [[f32::NAN; GROUP_ROWS]; 2];
            avx512.packed_dot::<F>(groups, std::slice::from_ref(x), &mut out, reads);
            out
        })
        .collect();
    let mut swapped: Vec<usize> = (0..n).collect();
    swapped.swap(3, 9);
    let orders = [
        ("in order", (0..n).collect::<Vec<_>>(), F::AMX),
        ("reversed", (0..n).rev().collect(), F::AMX),
        ("two swapped", swapped, false),
    ];
    for (name, order, tiles) in orders {
        let rows: Vec<F::Input<'_>> = order.iter().map(|&t| xs[t]).collect();
        let mut direct = vec![[f32::NAN; GROUP_ROWS]; 2 * n];
        // SAFETY: the AMX level is available (`with_level` above): the
        // AVX-512 level's features and AMX tiles this process may use.
        let took_tiles = unsafe { F::amx_pairs(groups, group_bytes, &rows, &mut direct) };
        assert_eq!(took_tiles, tiles, "{what}, rows {name}: tile product taken");
        let mut out = vec![[f32::NAN; GROUP_ROWS]; 2 * n];
        amx.packed_dot::<F>(groups, &rows, &mut out, reads);
        for (i, &t) in order.iter().enumerate() {
            for (g, want) in alone[t].iter().enumerate() {
                let got = out[g * n + i];
                assert_eq!(
                    got.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "{what}, rows {name}, row {t}, group {g}"
                );
                if tiles {
                    assert_eq!(direct[g * n + i].map(f32::to_bits), want.map(f32::to_bits));
                }
            }
        }
    }
}

/// `rows` activation rows of `cols` values, row `r` all `values[r mod
/// len]` but for the largest magnitude of the 16-bit split `SHIFT` once
/// per run of `per` values that share a scale (the last of each), so
/// that rows quantized with that run ([`Q16Act::quantize_per`]) hold each
/// value as that integer: rows at the planes' extremes for the formats'
/// extreme-value tests.
pub(crate) fn extreme_rows<const SHIFT: u32>(
    values: &[f32],
    rows: usize,
    cols: usize,
    per: usize,
) -> Vec<f32> {
    let mut x: Vec<f32> = (0..rows)
        .flat_map(|r| vec![values[r % values.len()]; cols])
        .collect();
    for run in x.chunks_exact_mut(per) {
        *run.last_mut().expect("a run of values") = crate::cpu::kernels::qact::q16_max(SHIFT);
    }
    x
}

/// The scalar level and every x86-64 SIMD level of the integer kernels,
/// for checks that take the scalar code's bits as theirs.
pub(crate) const SCALAR_AND_X86_LEVELS: [SimdLevel; 4] = [
    SimdLevel::Scalar,
    SimdLevel::Avx2,
    SimdLevel::AvxVnni,
    SimdLevel::Avx512,
];

/// `n` blocks of type `qt` (Q4_0/Q4_1, Q5_0/Q5_1 or Q8_0: a header of
/// the f16 scale `d`, and the f16 offset `m` for Q4_1 and Q5_1) whose
/// bytes after the header are all `body[0]`, or all `body[1]` in every
/// third block: weights at their extremes (`d` 0.01, `m` −0.02).
pub(crate) fn extreme_blocks(qt: QuantType, n: usize, body: [u8; 2]) -> Vec<u8> {
    let header = match qt {
        QuantType::Q4_1 | QuantType::Q5_1 => 4,
        _ => 2,
    };
    let mut w = vec![0u8; n * qt.block_bytes()];
    for (i, b) in w.chunks_exact_mut(qt.block_bytes()).enumerate() {
        b[..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        if header == 4 {
            b[2..4].copy_from_slice(&f16::from_f32(-0.02).to_le_bytes());
        }
        b[header..].fill(body[usize::from(i % 3 == 2)]);
    }
    w
}

/// One activation row of `cols` values per value of `values` (see
/// [`extreme_rows`]), each quantized in runs of `per` values.
pub(crate) fn extreme_acts<const SHIFT: u32>(
    values: &[f32],
    cols: usize,
    per: usize,
) -> Vec<Q16Act<SHIFT>> {
    (0..values.len())
        .map(|r| Q16Act::quantize_per(&extreme_rows::<SHIFT>(&values[r..], 1, cols, per), per))
        .collect()
}

/// A tile of 16 activation rows of `cols` values in one buffer (see
/// [`extreme_rows`]), quantized in runs of `per` values.
#[cfg(target_arch = "x86_64")]
pub(crate) fn extreme_tile<const SHIFT: u32>(
    values: &[f32],
    cols: usize,
    per: usize,
) -> Q16Act<SHIFT> {
    let rows = crate::cpu::kernels::simd::amx::TILE_ROWS;
    Q16Act::quantize_per(&extreme_rows::<SHIFT>(values, rows, cols, per), per)
}

/// The 16 rows of `act` (as [`extreme_tile`] makes), `cols` values each.
#[cfg(target_arch = "x86_64")]
pub(crate) fn tile_rows<'a, const SHIFT: u32>(
    act: &'a Q16Act<SHIFT>,
    cols: usize,
) -> Vec<Q16Row<'a, SHIFT>> {
    let rows = crate::cpu::kernels::simd::amx::TILE_ROWS;
    (0..rows).map(|t| act.row().sub_row(t, cols)).collect()
}

/// The AVX2 products of format `F` over one and two groups of `groups`
/// with the rows `xs` agree with the scalar code's to within float
/// rounding (the scalar code of some formats takes its float steps in
/// another order), which a wrapped or saturated integer sum would not.
pub(crate) fn check_near_scalar<F: PackedFormat>(groups: &[u8], xs: &[F::Input<'_>], what: &str) {
    let path = QuantPath::Int16Activations;
    let (Some(scalar), Some(avx2)) = (
        kernel_or_skip(path, SimdLevel::Scalar),
        kernel_or_skip(path, SimdLevel::Avx2),
    ) else {
        return;
    };
    let group_bytes = groups.len() / 2;
    for n in 1..=2 {
        let groups = &groups[..n * group_bytes];
        let mut want = vec![[f32::NAN; GROUP_ROWS]; n * xs.len()];
        scalar.packed_dot::<F>(groups, xs, &mut want, WeightReads::FromCache);
        let mut got = vec![[f32::NAN; GROUP_ROWS]; n * xs.len()];
        avx2.packed_dot::<F>(groups, xs, &mut got, WeightReads::FromCache);
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            let close = (g - w).abs() <= 1e-6 * w.abs();
            assert!(close, "{what}, {n} groups: AVX2 {g} against scalar {w}");
        }
    }
}

/// Q4_0 and Q4_1 weights at their extremes (every nibble 15, or every
/// nibble 0) against rows whose values (`values`, each in every column,
/// the split's largest magnitude once per block so that each becomes that
/// integer) put the planes at their extremes: every level gives the AVX2
/// bits, the AVX2 products agree with the scalar code's, and the AMX tiles
/// of 16 such rows give the AVX-512 bits, so no kernel's integer sums wrap
/// or saturate there.
fn check_extreme_levels<const SHIFT: u32>(values: &[f32]) {
    for qt in [QuantType::Q4_0, QuantType::Q4_1] {
        let nb = 3;
        let (rows, cols) = (2 * GROUP_ROWS, nb * BLOCK);
        let w = extreme_blocks(qt, rows * nb, [0xFF, 0x00]);
        let m = QuantMatrix::new(qt, &w, rows, cols).unwrap();
        let p = PackedQ4::pack(&m).unwrap();
        let acts = extreme_acts::<SHIFT>(values, cols, BLOCK);
        let xs: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let levels = [SimdLevel::Avx2, SimdLevel::AvxVnni, SimdLevel::Avx512];
        let what = format!("extreme {qt} split at {SHIFT}");
        check_group_products::<Q4Format<SHIFT>>(p.groups(0, 2), &xs, &levels, &what);
        check_near_scalar::<Q4Format<SHIFT>>(p.groups(0, 2), &xs, &what);
        #[cfg(target_arch = "x86_64")]
        {
            let act = extreme_tile::<SHIFT>(values, cols, BLOCK);
            check_tile_products::<Q4Format<SHIFT>>(p.groups(0, 2), &tile_rows(&act, cols), &what);
        }
    }
}

#[test]
fn extreme_sums_agree_at_every_level() {
    // `-32384 = 256·(-126) - 128`, and the wide split's largest value.
    check_extreme_levels::<WIDE>(&[-32384.0, 32639.0, -32639.0]);
    check_extreme_levels::<BYTE>(&[-127.0, 127.0]);
}

/// The two-group product of kernel `k` over `groups` (two packed
/// groups) equals each group's own product, bit for bit, for one to
/// all of the rows `xs`: a task split that leaves a group without its
/// neighbour must not change its outputs.
pub(crate) fn check_pair_equals_groups_alone<F: PackedFormat>(
    k: QuantKernel,
    groups: &[u8],
    xs: &[F::Input<'_>],
    what: &str,
) {
    let group_bytes = groups.len() / 2;
    for t in 1..=xs.len() {
        let mut pair = vec![[f32::NAN; GROUP_ROWS]; 2 * t];
        k.packed_dot::<F>(groups, &xs[..t], &mut pair, WeightReads::FromMemory);
        for (g, want) in pair.chunks_exact(t).enumerate() {
            let mut alone = vec![[f32::NAN; GROUP_ROWS]; t];
            let group = &groups[g * group_bytes..][..group_bytes];
            k.packed_dot::<F>(group, &xs[..t], &mut alone, WeightReads::FromCache);
            assert_eq!(
                alone,
                want,
                "{what}: {:?}, group {g} alone, {t} rows",
                k.level()
            );
        }
    }
}

/// The AVX-VNNI and AVX-512 VNNI group products of rows split at
/// `SHIFT` equal the AVX2 one bit for bit (the same integer block sums,
/// the same float steps), for one group (256-bit) and two (512-bit, and
/// the AVX2 two-group kernel) and one to four activation rows, and each
/// level's two-group product equals the groups' own.
fn check_levels<const SHIFT: u32>(rng: &mut Rng) {
    for qt in [QuantType::Q4_0, QuantType::Q4_1] {
        let nb = 9;
        let w = random_blocks(rng, qt, 2 * GROUP_ROWS * nb);
        let m = QuantMatrix::new(qt, &w, 2 * GROUP_ROWS, nb * BLOCK).unwrap();
        let p = PackedQ4::pack(&m).unwrap();
        let acts: Vec<Q16Act<SHIFT>> = (0..TILE_TOKENS)
            .map(|_| Q16Act::quantize(&rng.vec(nb * BLOCK, 3.0)))
            .collect();
        let rows: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let levels = [SimdLevel::Avx2, SimdLevel::AvxVnni, SimdLevel::Avx512];
        let what = format!("{qt} split at {SHIFT}");
        check_group_products::<Q4Format<SHIFT>>(p.groups(0, 2), &rows, &levels, &what);
        #[cfg(target_arch = "x86_64")]
        {
            let tile = crate::cpu::kernels::simd::amx::TILE_ROWS;
            let act = Q16Act::<SHIFT>::quantize(&rng.vec(tile * nb * BLOCK, 3.0));
            let rows: Vec<Q16Row<'_, SHIFT>> = (0..tile)
                .map(|t| act.row().sub_row(t, nb * BLOCK))
                .collect();
            check_tile_products::<Q4Format<SHIFT>>(p.groups(0, 2), &rows, &what);
        }
    }
}

#[test]
fn vnni_group_dot_equals_avx2() {
    let mut rng = Rng::new(44);
    check_levels::<WIDE>(&mut rng);
    check_levels::<BYTE>(&mut rng);
}

/// Row counts for [`check_tiles_take_rows`]: one, three and eight tiles
/// of rows, with and without rows after the last whole tile.
#[cfg(target_arch = "x86_64")]
pub(crate) const MANY_TILE_ROWS: [usize; 4] = [16, 21, 48, 8 * 16 + 5];

/// The tile kernel of `F`, a format of `types`' blocks whose groups
/// `pack` gives (all `groups_n` of a matrix), takes many tiles of rows
/// at once (see [`MANY_TILE_ROWS`]), over two spans of blocks and part
/// of a third ([`check_tiles_take_rows`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn check_blocks_take_many_tiles<F, const SHIFT: u32>(
    rng: &mut Rng,
    types: &[QuantType],
    pack: impl Fn(&QuantMatrix<'_>, usize) -> Vec<u8>,
) where
    F: for<'a> PackedFormat<Input<'a> = Q16Row<'a, SHIFT>>,
{
    let (groups_n, nb) = (4, 2 * crate::cpu::kernels::simd::amx::SPAN + 2);
    for &qt in types {
        let w = random_blocks(rng, qt, groups_n * GROUP_ROWS * nb);
        let m = QuantMatrix::new(qt, &w, groups_n * GROUP_ROWS, nb * BLOCK).unwrap();
        let groups = pack(&m, groups_n);
        let what = format!("{qt} split at {SHIFT}");
        for n in MANY_TILE_ROWS {
            let act = Q16Act::<SHIFT>::quantize(&rng.vec(n * nb * BLOCK, 3.0));
            let rows: Vec<Q16Row<'_, SHIFT>> =
                (0..n).map(|t| act.row().sub_row(t, nb * BLOCK)).collect();
            check_tiles_take_rows::<F>((&groups, groups_n), &rows, &what);
        }
    }
}

/// The Q4 tile kernel takes many tiles of rows at once.
#[cfg(target_arch = "x86_64")]
fn check_many_tiles<const SHIFT: u32>(rng: &mut Rng) {
    let types = [QuantType::Q4_0, QuantType::Q4_1];
    check_blocks_take_many_tiles::<Q4Format<SHIFT>, SHIFT>(rng, &types, |m, groups_n| {
        PackedQ4::pack(m).unwrap().groups(0, groups_n).to_vec()
    });
}

#[cfg(target_arch = "x86_64")]
#[test]
fn amx_tiles_take_many_rows() {
    let mut rng = Rng::new(45);
    check_many_tiles::<WIDE>(&mut rng);
    check_many_tiles::<BYTE>(&mut rng);
}
