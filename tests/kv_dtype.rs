//! KV caches stored as f16, Q8_0 or Q4 (`LoadOptions::kv_dtype`,
//! `--kv-dtype`) on the tiny fixtures: the logits stay close to the
//! transformers reference, decode steps see the same cache as a prefill,
//! and the types that need whole blocks per head refuse heads that are not.

mod common;

use common::*;
use mllm::core::{DType, KvDtype, LogitsMode, Placement, StepInput};
use mllm::models::{LoadOptions, Model};

fn load_with(path: &std::path::Path, kv_dtype: KvDtype) -> mllm::core::Result<Model> {
    Model::load(
        path,
        &LoadOptions {
            threads: 2,
            kv_dtype,
            ..Default::default()
        },
    )
}

/// Largest logit distances over the long input: (prefill from the
/// reference, token-by-token decode from the reference, decode from
/// prefill).
fn distances(model: &mut Model, reference: &Reference) -> (f32, f32, f32) {
    let ids = reference.ids("/inputs/long");
    let want = reference.array("logits_long");
    model.reset_slot(0);
    let prefill = model
        .step(&StepInput::single(0, ids.clone(), LogitsMode::All))
        .unwrap();
    let rows = cached_step_logits(model, &ids[..1], &ids[1..]);
    let mut by_token = 0f32;
    let mut between = 0f32;
    for (i, row) in rows.iter().enumerate() {
        by_token = by_token.max(max_abs_diff(row, want.row(i)));
        between = between.max(max_abs_diff(row, prefill.row(i)));
    }
    (max_abs_diff(prefill.data(), &want.data), by_token, between)
}

/// tiny-qwen3 (heads of 32), every type. Prefill and token-by-token decode
/// read the same stored cache, so they agree with each other within 1e-4
/// with an f32 cache and within 1e-3 with the encoded ones: prefill's and
/// decode's f32 kernels may compute a key or value an ulp apart, and
/// encoding can round the two to neighbouring steps of the type (measured
/// 1.1e-4 for f16 on an AVX2-only CPU, 4e-6 otherwise), while decode
/// reading values the cache did not store would move the logits by the
/// type's whole rounding error (3e-3 for f16, far more for the others).
/// The f32 and f16 caches stay within 1e-4 and 1e-2 of the reference
/// (measured 7e-6 and 3.3e-3); the 8- and 4-bit ones move these
/// random-weight logits much more (measured 0.13 and 1.37) but must move
/// them.
#[test]
fn prefill_and_decode_read_the_same_stored_cache() {
    let c = convert_to(&fixture("tiny-qwen3"), DType::F32);
    let reference = Reference::load("tiny-qwen3");
    for (kv, bound) in [
        (KvDtype::F32, 1e-4),
        (KvDtype::F16, 1e-2),
        (KvDtype::Q8_0, 0.5),
        (KvDtype::Q4_1, 4.0),
    ] {
        let mut model = load_with(&c.path, kv).unwrap();
        let (one_step, by_token, between) = distances(&mut model, &reference);
        let same_cache = if kv == KvDtype::F32 { 1e-4 } else { 1e-3 };
        assert!(
            between <= same_cache,
            "{kv}: prefill and decode differ by {between}"
        );
        assert!(one_step <= bound, "{kv} prefill: {one_step} over {bound}");
        assert!(by_token <= bound, "{kv} decode: {by_token} over {bound}");
        if kv != KvDtype::F32 {
            assert!(
                one_step > 1e-3,
                "{kv}: the logits barely moved ({one_step})"
            );
        }
    }
}

/// tiny-llama has heads of 16 values: f16 works, the 32-value block types
/// are refused with an error naming the head dimension.
#[test]
fn block_types_refuse_heads_smaller_than_a_block() {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let reference = Reference::load("tiny-llama");
    let mut model = load_with(&c.path, KvDtype::F16).unwrap();
    let (one_step, by_token, _) = distances(&mut model, &reference);
    assert!(
        one_step <= 2e-2 && by_token <= 2e-2,
        "{one_step} {by_token}"
    );
    for kv in [KvDtype::Q8_0, KvDtype::Q4_1] {
        let err = load_with(&c.path, kv).err().expect("must be refused");
        let msg = err.to_string();
        assert!(
            msg.contains("head dimension 16") && msg.contains(&kv.to_string()),
            "{msg}"
        );
    }
}

/// The CUDA backend keeps an f32 cache: asking it for another type is an
/// error before any device is opened.
#[test]
fn compressed_caches_are_refused_on_cuda() {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let err = Model::load(
        &c.path,
        &LoadOptions {
            kv_dtype: KvDtype::F16,
            placement: Placement::from_flags(Some("cuda"), None).unwrap(),
            ..Default::default()
        },
    )
    .err()
    .expect("must be refused");
    assert!(
        err.to_string()
            .contains("--kv-dtype f16 runs on the CPU only"),
        "{err}"
    );
}

/// A slot copied from another (`Model::copy_slot`, how the server shares a
/// prompt prefix between sequences) continues exactly as the original, for
/// every cache type: the rest of the prompt gives the very logits of a
/// whole-prompt prefill, the next decode step equals the original's, and
/// the original is unchanged. Copying more than the source holds, or a
/// slot onto itself, is an error.
#[test]
fn a_copied_prefix_continues_as_the_original() {
    let c = convert_to(&fixture("tiny-qwen3"), DType::F32);
    let ids: Vec<u32> = (3..43).collect();
    for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1] {
        let mut model = load_with(&c.path, kv).unwrap();
        let whole = model
            .step(&StepInput::single(0, ids.clone(), LogitsMode::All))
            .unwrap();
        // Slot 2 held something else before: the copy replaces it.
        model
            .step(&StepInput::single(2, vec![9; 50], LogitsMode::Last))
            .unwrap();
        model.copy_slot(0, 2, 25).unwrap();
        assert_eq!(model.slot_len(2), 25);
        let rest = model
            .step(&StepInput::single(2, ids[25..].to_vec(), LogitsMode::All))
            .unwrap();
        let vocab = whole.shape().last();
        assert_eq!(rest.data(), &whole.data()[25 * vocab..], "{kv:?}");
        let next = |m: &mut Model, slot| {
            m.step(&StepInput::single(slot, vec![7], LogitsMode::Last))
                .unwrap()
                .row(0)
                .to_vec()
        };
        assert_eq!(next(&mut model, 0), next(&mut model, 2), "{kv:?}");
        assert_eq!(model.slot_len(0), 41);

        let err = model.copy_slot(0, 3, 42).unwrap_err().to_string();
        assert!(
            err.contains("cannot copy 42 tokens of slot 0 (holding 41) into slot 3"),
            "{err}"
        );
        assert!(model.copy_slot(1, 1, 0).is_err());
    }
}
