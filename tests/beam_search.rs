//! Beam search against transformers' `generate(num_beams=..., do_sample=False)`
//! on the tiny fixtures (`tests/fixtures/beam_search.json`, made by
//! `scripts/make_beam_references.py`): the same hypotheses, token for token,
//! with the same scores, alone and with several prompts in one batch.

mod common;

use std::collections::BTreeMap;

use common::*;
use mllm::models::{beam_search, beam_search_batch, BeamOptions, EarlyStopping, Hypothesis, Model};
use serde_json::Value;

/// Scores are sums of up to 16 log-probabilities computed from logits
/// within 1e-4 of the reference, scaled by the length penalty: compared
/// relative to their size (absolutely below 1).
const SCORE_TOL: f32 = 1e-4;

struct Case {
    model: String,
    prompt: Vec<u32>,
    opts: BeamOptions,
    want: Vec<Hypothesis>,
    /// Steps transformers ran before its stopping rules ended the search.
    steps: usize,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixture("beam_search.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            model: c["model"].as_str().unwrap().to_string(),
            prompt: ids(&c["prompt"]),
            opts: BeamOptions {
                num_beams: c["num_beams"].as_u64().unwrap() as usize,
                max_tokens: c["max_new_tokens"].as_u64().unwrap() as usize,
                length_penalty: c["length_penalty"].as_f64().unwrap() as f32,
                early_stopping: match &c["early_stopping"] {
                    Value::Bool(b) => b.to_string(),
                    v => v.as_str().unwrap().to_string(),
                }
                .parse()
                .unwrap(),
                num_return_sequences: c["num_return_sequences"].as_u64().unwrap() as usize,
                eos_ids: ids(&c["eos_ids"]),
            },
            want: c["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| Hypothesis {
                    tokens: ids(&r["ids"]),
                    score: r["score"].as_f64().unwrap() as f32,
                })
                .collect(),
            steps: c["steps"].as_u64().unwrap() as usize,
        })
        .collect()
}

fn by_model() -> BTreeMap<String, Vec<Case>> {
    let mut map: BTreeMap<String, Vec<Case>> = BTreeMap::new();
    for c in cases() {
        map.entry(c.model.clone()).or_default().push(c);
    }
    map
}

fn assert_same(what: &str, got: &[Hypothesis], want: &[Hypothesis]) {
    let tokens = |h: &[Hypothesis]| h.iter().map(|x| x.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(got), tokens(want), "{what}: tokens");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g.score - w.score).abs() <= SCORE_TOL * w.score.abs().max(1.0),
            "{what}: hypothesis {i} scored {} against {}",
            g.score,
            w.score
        );
    }
}

fn describe(c: &Case) -> String {
    format!(
        "{} prompt {:?} beams {} length penalty {} {:?} eos {:?}",
        c.model,
        &c.prompt[..3],
        c.opts.num_beams,
        c.opts.length_penalty,
        c.opts.early_stopping,
        c.opts.eos_ids
    )
}

#[test]
fn hypotheses_and_scores_equal_transformers() {
    let all = by_model();
    assert_eq!(all.len(), 3);
    let (mut ended_early, mut stopped_early) = (0, 0);
    for (name, cases) in &all {
        let (_c, mut model) = load_fixture(name);
        for c in cases {
            let got = beam_search(&mut model, &c.prompt, &c.opts).unwrap();
            assert_same(&describe(c), &got.hypotheses, &c.want);
            assert_eq!(got.steps, c.steps, "{}: steps", describe(c));
            ended_early += c
                .want
                .iter()
                .filter(|h| h.tokens.len() < c.opts.max_tokens)
                .count();
            stopped_early += usize::from(c.steps < c.opts.max_tokens);
        }
    }
    // Hypotheses end at an end-of-sequence id inside the budget, and the
    // stopping rules end searches before it.
    assert!(ended_early >= 3, "{ended_early}");
    assert!(stopped_early >= 3, "{stopped_early}");
}

#[test]
fn prompts_searched_together_give_what_each_gives_alone() {
    for (name, cases) in by_model() {
        let (_c, mut model) = load_fixture(&name);
        for c in &cases {
            // The case's prompt with the other prompts of the file.
            let mut prompts = vec![c.prompt.clone()];
            for other in &cases {
                if !prompts.contains(&other.prompt) {
                    prompts.push(other.prompt.clone());
                }
            }
            let alone: Vec<_> = prompts
                .iter()
                .map(|p| beam_search(&mut model, p, &c.opts).unwrap())
                .collect();
            let together = beam_search_batch(&mut model, &prompts, &c.opts).unwrap();
            assert_same(&describe(c), &together[0].hypotheses, &c.want);
            for (t, a) in together.iter().zip(&alone) {
                assert_eq!(t, a, "{}", describe(c));
            }
        }
    }
}

#[test]
fn one_beam_is_greedy_decoding() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let r = Reference::load("tiny-llama");
    let prompt = r.ids("/greedy/short/prompt_ids");
    let want = r.ids("/greedy/short/new_ids");
    let opts = BeamOptions {
        num_beams: 1,
        max_tokens: want.len(),
        ..Default::default()
    };
    let got = beam_search(&mut model, &prompt, &opts).unwrap();
    assert_eq!(got.hypotheses[0].tokens, want);
}

#[test]
fn bad_requests_are_errors_and_leave_the_model_usable() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let ctx = model.max_context();
    let opts = BeamOptions {
        num_beams: 2,
        max_tokens: 8,
        ..Default::default()
    };
    let long = vec![5u32; ctx - 6];
    let err = beam_search(&mut model, &long, &opts).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid input: prompt 0 ({} tokens) plus max_tokens 8 is over the context of {ctx} tokens",
            ctx - 6
        )
    );
    let err = beam_search_batch(&mut model, &[vec![1, 2], vec![]], &opts).unwrap_err();
    assert_eq!(err.to_string(), "invalid input: prompt 1 is empty");
    let err = beam_search(
        &mut model,
        &[1, 2, 3],
        &BeamOptions {
            early_stopping: EarlyStopping::WhenFull,
            num_return_sequences: 3,
            ..opts.clone()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("num_return_sequences"), "{err}");
    // The longest prompt that fits still runs.
    let fits = vec![5u32; ctx - 7];
    let out = beam_search(&mut model, &fits, &opts).unwrap();
    assert_eq!(out.hypotheses[0].tokens.len(), 8);
}

/// Beam search leaves nothing behind in the slots it used.
#[test]
fn the_slots_are_empty_afterwards() {
    let (_c, mut model): (_, Model) = load_fixture("tiny-gpt2");
    let opts = BeamOptions {
        num_beams: 3,
        max_tokens: 5,
        ..Default::default()
    };
    beam_search_batch(&mut model, &[vec![1, 2, 3], vec![4, 5]], &opts).unwrap();
    for slot in 0..12 {
        assert_eq!(model.slot_len(slot), 0, "slot {slot}");
    }
}
