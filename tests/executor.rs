//! Executor behaviour: plans are reused while shapes stay the same, buffers
//! are shared by liveness, and bad steps are clear errors.

mod common;

use common::*;
use mllm::core::{Error, LogitsMode, SeqChunk, StepInput};
use mllm::models::{LoadOptions, Model};

#[test]
fn reshape_runs_only_when_shapes_change() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let step = |m: &mut Model, tokens: Vec<u32>| {
        m.step(&StepInput::single(0, tokens, LogitsMode::Last))
            .unwrap()
    };
    step(&mut model, vec![1, 2, 3, 4]);
    assert_eq!(model.executor().reshape_count(), 1);
    let arena = model.executor().arena_len();
    for t in 5..15 {
        step(&mut model, vec![t]);
    }
    assert_eq!(
        model.executor().reshape_count(),
        2,
        "decode steps share one plan"
    );
    assert!(
        model.executor().arena_len() <= arena,
        "decode needs no new buffers"
    );
    step(&mut model, vec![7, 8, 9, 10]);
    assert_eq!(model.executor().reshape_count(), 3);
}

#[test]
fn buffers_are_shared_across_nodes() {
    let (_c, mut model) = load_fixture("tiny-llama");
    model
        .step(&StepInput::single(0, vec![1; 40], LogitsMode::All))
        .unwrap();
    // Without reuse every activation would get its own buffer: the graph has
    // over thirty [40, 64..256] values, but only a handful are live at once.
    let nodes = model.executor().graph().nodes().len();
    let arena = model.executor().arena_len();
    let per_value = 40 * 128;
    assert!(nodes > 30, "{nodes}");
    assert!(
        arena < 8 * per_value,
        "arena of {arena} floats for {nodes} nodes"
    );
}

#[test]
fn prompt_over_the_context_is_an_error() {
    let c = convert_to(&fixture("tiny-llama"), mllm::core::DType::F32);
    let opts = LoadOptions {
        max_context: Some(16),
        threads: 1,
        ..Default::default()
    };
    let mut model = Model::load(&c.path, &opts).unwrap();
    let err = model
        .step(&StepInput::single(0, vec![1; 17], LogitsMode::Last))
        .unwrap_err();
    match err {
        Error::ContextFull {
            slot: 0,
            needed: 17,
            limit: 16,
        } => {}
        other => panic!("expected ContextFull, got {other:?}"),
    }
    model
        .step(&StepInput::single(0, vec![1; 16], LogitsMode::Last))
        .unwrap();
    assert!(matches!(
        model.step(&StepInput::single(0, vec![1], LogitsMode::Last)),
        Err(Error::ContextFull { needed: 17, .. })
    ));
}

#[test]
fn bad_steps_are_errors() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let err = model
        .step(&StepInput::single(0, vec![1, 256], LogitsMode::Last))
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("256")),
        "{err:?}"
    );
    assert_eq!(
        model.slot_len(0),
        0,
        "a failed step does not advance the sequence"
    );

    let dup = StepInput {
        chunks: vec![
            SeqChunk {
                slot: 3,
                tokens: vec![1],
            },
            SeqChunk {
                slot: 3,
                tokens: vec![2],
            },
        ],
        logits: LogitsMode::Last,
    };
    assert!(matches!(model.step(&dup), Err(Error::InvalidInput(m)) if m.contains("twice")));
    assert!(matches!(
        model.step(&StepInput::single(0, vec![], LogitsMode::Last)),
        Err(Error::InvalidInput(_))
    ));
}

#[test]
fn slots_are_independent_and_resettable() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let ids = Reference::load("tiny-llama").ids("/inputs/short");
    let alone = model
        .step(&StepInput::single(0, ids.clone(), LogitsMode::Last))
        .unwrap();
    model
        .step(&StepInput::single(1, vec![5, 6, 7], LogitsMode::Last))
        .unwrap();
    model.reset_slot(0);
    let again = model
        .step(&StepInput::single(0, ids, LogitsMode::Last))
        .unwrap();
    assert_eq!(alone, again);
    assert_eq!(model.slot_len(1), 3);
}

/// Batch invariance at the model level: a sequence's logits are the same,
/// bit for bit, whether its step runs alone or packed with other sequences
/// (their decode tokens and prefill chunks), for f32 and quantized weights.
#[test]
fn a_sequence_gets_the_same_logits_alone_or_packed_with_others() {
    use mllm::core::DType;
    for dtype in [DType::F32, DType::Q8_0, DType::Q4_1] {
        let c = convert_to(&fixture("tiny-llama"), dtype);
        let mut model = load(&c.path);
        let prompt: Vec<u32> = (1..20).collect();
        // Alone: prefill, then three decode steps.
        let mut alone = Vec::new();
        let out = model
            .step(&StepInput::single(0, prompt.clone(), LogitsMode::Last))
            .unwrap();
        alone.push(out.row(0).to_vec());
        for t in [5, 9, 11] {
            let out = model
                .step(&StepInput::single(0, vec![t], LogitsMode::Last))
                .unwrap();
            alone.push(out.row(0).to_vec());
        }
        // Packed: the same sequence in slot 3, beside others of every kind.
        for s in 0..5 {
            model.reset_slot(s);
        }
        model
            .step(&StepInput::single(1, vec![7; 9], LogitsMode::Last))
            .unwrap();
        let chunk = |slot, tokens: Vec<u32>| SeqChunk { slot, tokens };
        let first = model
            .step(&StepInput {
                chunks: vec![
                    chunk(1, vec![3]),
                    chunk(3, prompt.clone()),
                    chunk(2, vec![4; 33]),
                ],
                logits: LogitsMode::Last,
            })
            .unwrap();
        let mut packed = vec![first.row(1).to_vec()];
        for (i, t) in [5, 9, 11].into_iter().enumerate() {
            let mut chunks = vec![chunk(3, vec![t]), chunk(1, vec![6]), chunk(2, vec![8])];
            if i == 1 {
                chunks.push(chunk(4, vec![2; 17]));
            }
            let out = model
                .step(&StepInput {
                    chunks,
                    logits: LogitsMode::Last,
                })
                .unwrap();
            packed.push(out.row(0).to_vec());
        }
        assert_eq!(alone, packed, "{dtype:?}");
    }
}

#[test]
fn glu_output_takes_over_the_up_buffer() {
    // tiny-llama: hidden 64, intermediate 128. Were the GLU's output a
    // buffer of its own, the step would hold the residual stream [n, 64]
    // and gate, up and the output [n, 128] at once: n · (64 + 3 · 128).
    let (hidden, intermediate) = (64, 128);
    for n in [40usize, 100] {
        let (_c, mut model) = load_fixture("tiny-llama");
        let logits = model
            .step(&StepInput::single(0, vec![3; n], LogitsMode::Last))
            .unwrap();
        assert!(logits.data().iter().all(|v| v.is_finite()));
        let arena = model.executor().arena_len();
        assert!(
            arena < n * (hidden + 3 * intermediate),
            "{n} tokens: arena of {arena} floats"
        );
    }
}
