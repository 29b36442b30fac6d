//! Which tokens one engine step runs: the pending decode token of every
//! running sequence, then prefill chunks of waiting prompts while the token
//! budget lasts.
//!
//! Prefill chunks end at multiples of the chunk length (counted from the
//! start of the prompt), whatever else shares the step. So every prompt
//! position is always computed in the same chunk, by the same kernels, and
//! a request's results never depend on the load.

/// Where one admitted sequence stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Tokens in the prompt.
    pub prompt_len: usize,
    /// Prompt tokens already in the KV cache.
    pub prefilled: usize,
    /// Whether a sampled token waits to be fed (the sequence is decoding).
    pub decoding: bool,
}

/// The work of one sequence in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Feed the pending token.
    Decode,
    /// Feed prompt tokens `start..end`.
    Prefill { start: usize, end: usize },
}

/// End of the prefill chunk that starts at `prefilled`: the next multiple
/// of `chunk`, or the end of the prompt.
pub fn chunk_end(prefilled: usize, prompt_len: usize, chunk: usize) -> usize {
    ((prefilled / chunk + 1) * chunk).min(prompt_len)
}

/// Plans one step over `seqs` (in admission order): every decoding
/// sequence gets its token, then prefilling sequences get their next chunk,
/// in order, while the chunks fit in `budget` tokens. Returns `(index in
/// seqs, work)` pairs, decode work first.
///
/// With `budget >= decoding + chunk`, which the engine guarantees, the first
/// waiting prompt always advances, so no prompt waits on decoding and no
/// decoding sequence waits more than one step on a prompt.
pub fn plan_step(seqs: &[Progress], budget: usize, chunk: usize) -> Vec<(usize, Work)> {
    let mut plan: Vec<(usize, Work)> = seqs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.decoding)
        .map(|(i, _)| (i, Work::Decode))
        .collect();
    let mut left = budget.saturating_sub(plan.len());
    for (i, s) in seqs.iter().enumerate() {
        if s.decoding || s.prefilled >= s.prompt_len {
            continue;
        }
        let end = chunk_end(s.prefilled, s.prompt_len, chunk);
        let n = end - s.prefilled;
        if n > left {
            break;
        }
        left -= n;
        plan.push((
            i,
            Work::Prefill {
                start: s.prefilled,
                end,
            },
        ));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(prompt_len: usize, prefilled: usize) -> Progress {
        Progress {
            prompt_len,
            prefilled,
            decoding: false,
        }
    }

    const DECODING: Progress = Progress {
        prompt_len: 5,
        prefilled: 5,
        decoding: true,
    };

    #[test]
    fn chunks_end_on_multiples_of_the_chunk_length() {
        assert_eq!(chunk_end(0, 300, 64), 64);
        assert_eq!(chunk_end(64, 300, 64), 128);
        assert_eq!(chunk_end(256, 300, 64), 300);
        assert_eq!(chunk_end(0, 10, 64), 10);
        assert_eq!(chunk_end(128, 200, 128), 200);
    }

    #[test]
    fn decode_tokens_come_first_then_chunks_in_order_within_budget() {
        let seqs = [
            prefill(100, 0),
            DECODING,
            prefill(30, 0),
            DECODING,
            prefill(10, 0),
        ];
        let plan = plan_step(&seqs, 100, 64);
        assert_eq!(
            plan,
            vec![
                (1, Work::Decode),
                (3, Work::Decode),
                (0, Work::Prefill { start: 0, end: 64 }),
                (2, Work::Prefill { start: 0, end: 30 }),
            ]
        );
    }

    #[test]
    fn a_chunk_that_does_not_fit_waits_and_keeps_its_boundaries() {
        // 64-token budget with two decoding sequences: the chunk 64..128
        // does not fit, and nothing behind it jumps the queue.
        let seqs = [DECODING, prefill(200, 64), DECODING, prefill(5, 0)];
        assert_eq!(
            plan_step(&seqs, 64, 64),
            vec![(0, Work::Decode), (2, Work::Decode)]
        );
        // With room for it, the chunk is exactly 64..128.
        assert_eq!(
            plan_step(&seqs, 66 + 5, 64),
            vec![
                (0, Work::Decode),
                (2, Work::Decode),
                (
                    1,
                    Work::Prefill {
                        start: 64,
                        end: 128
                    }
                ),
                (3, Work::Prefill { start: 0, end: 5 }),
            ]
        );
    }

    #[test]
    fn a_prompt_prefilled_alone_or_under_load_uses_the_same_chunks() {
        let chunks = |budget: usize, decoding: usize| {
            let mut seqs = vec![DECODING; decoding];
            seqs.push(prefill(333, 0));
            let mut seen = Vec::new();
            while seqs[decoding].prefilled < 333 {
                for (i, w) in plan_step(&seqs, budget, 64) {
                    if let Work::Prefill { start, end } = w {
                        assert_eq!(i, decoding);
                        seen.push((start, end));
                        seqs[i].prefilled = end;
                    }
                }
            }
            seen
        };
        let alone = chunks(512, 0);
        assert_eq!(alone.len(), 6);
        assert_eq!(alone, chunks(72, 8));
        assert_eq!(alone, chunks(65, 1));
    }
}
