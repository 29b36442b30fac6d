//! Continuous batching on the default model: outputs that do not depend on
//! the load, cancellation, prefix reuse and the queue limit.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// Sixteen different requests: short and long prompts (the long ones span
/// several prefill chunks), greedy and seeded sampling.
fn requests() -> Vec<Value> {
    let topics = [
        "the sea",
        "a mountain",
        "bread",
        "a violin",
        "winter",
        "a robot",
        "the moon",
        "coffee",
    ];
    let mut v = Vec::new();
    for (i, t) in topics.iter().enumerate() {
        let long = format!(
            "Here is some context. {} Now write one sentence about {t}.",
            "Facts about the world are many and varied. ".repeat(3 + 4 * i)
        );
        v.push(
            json!({"messages": [{"role": "user", "content": format!("Tell me about {t}.")}],
            "temperature": 0, "max_tokens": 20, "ignore_eos": true}),
        );
        v.push(json!({"messages": [{"role": "user", "content": long}],
            "temperature": 0.8, "top_p": 0.95, "seed": i, "max_tokens": 20, "ignore_eos": true,
            "logprobs": true}));
    }
    v
}

/// The reply text and the generated tokens (as the logprob entries name
/// them, or the text when logprobs were not asked for).
fn outcome(v: &Value) -> (String, Value, Value) {
    (
        reply(v),
        v["choices"][0]["logprobs"].clone(),
        v["usage"]["completion_tokens"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_requests_give_what_each_gives_alone() {
    let base = start(engine(8, 64), 1024, None).await;
    let reqs = requests();
    let mut alone = Vec::new();
    for r in &reqs {
        let (status, v) = post(&base, "/v1/chat/completions", r).await;
        assert_eq!(status, 200, "{v}");
        alone.push(outcome(&v));
    }
    // All at once: eight run, eight wait in the queue and join as slots free.
    let tasks: Vec<_> = reqs
        .iter()
        .cloned()
        .map(|r| {
            let base = base.clone();
            tokio::spawn(async move { post(&base, "/v1/chat/completions", &r).await })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(outcome(&v), alone[i], "request {i} differs under load");
    }
    let (_, metrics) = get(&base, "/metrics").await;
    let steps = metric(&metrics, "mllm_steps_total");
    let tokens = metric(&metrics, "mllm_step_tokens_total");
    // Batching happened: far fewer steps than tokens fed.
    assert!(tokens > 2.0 * steps, "{tokens} tokens in {steps} steps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_client_frees_its_slot_at_once() {
    let base = start(engine(1, 4), 2048, None).await;
    let body = json!({"prompt": "Count: one, two,", "max_tokens": 1900, "ignore_eos": true,
        "temperature": 0, "stream": true});
    let r = client()
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let mut seen = 0;
    while seen < 3 {
        stream.next().await.unwrap().unwrap();
        seen += 1;
    }
    drop(stream);
    // The only slot frees at once: a new request completes long before the
    // first would have ended, and the metrics show the cancellation.
    let started = Instant::now();
    let (status, v) = post(
        &base,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (_, metrics) = get(&base, "/metrics").await;
    assert_eq!(metric(&metrics, "mllm_cancelled_total"), 1.0, "{metrics}");
    assert_eq!(metric(&metrics, "mllm_active_sequences"), 0.0);
    let generated = metric(&metrics, "mllm_completion_tokens_total");
    assert!(
        generated < 1000.0,
        "the cancelled request went on: {generated} tokens"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_chat_turn_prefills_only_what_is_new() {
    let system = format!(
        "You are a careful assistant. {}",
        "Always be polite and precise. ".repeat(30)
    );
    let turn1 = json!({"messages": [{"role": "system", "content": system},
        {"role": "user", "content": "Name a fruit."}], "temperature": 0, "max_tokens": 12});
    let base = start(engine(2, 16), 1024, None).await;
    let (_, first) = post(&base, "/v1/chat/completions", &turn1).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let answer = reply(&first);
    let turn2 = json!({"messages": [{"role": "system", "content": system},
        {"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": answer},
        {"role": "user", "content": "And a vegetable?"}], "temperature": 0, "max_tokens": 12,
        "logprobs": true, "top_logprobs": 3});
    let (_, second) = post(&base, "/v1/chat/completions", &turn2).await;
    let prompt1 = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The whole first prompt is reused (its last token was prefilled with
    // others, in a chunk of several tokens), the first reply is not.
    assert_ne!(prompt1 % 64, 1);
    assert_eq!(cached, prompt1, "{second}");
    assert!(cached >= 192);
    let (_, metrics) = get(&base, "/metrics").await;
    assert_eq!(
        metric(&metrics, "mllm_prefix_reused_tokens_total"),
        cached as f64
    );
    // Reuse is exact: a fresh server that prefills everything answers the
    // same tokens with the same log-probabilities.
    let fresh = start(engine(2, 16), 1024, None).await;
    let (_, again) = post(&fresh, "/v1/chat/completions", &turn2).await;
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(reply(&again), reply(&second));
    assert_eq!(
        again["choices"][0]["logprobs"],
        second["choices"][0]["logprobs"]
    );
    assert!(second["choices"][0]["logprobs"]["content"][0]["logprob"].is_number());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_is_prefilled_once_and_changes_nothing() {
    let ask = |question: &str| {
        json!({"messages": [{"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": question}], "temperature": 0, "max_tokens": 8,
            "logprobs": true, "top_logprobs": 2})
    };
    let (first, second) = (ask("Name a fruit."), ask("Name a colour."));
    let base = start(engine(1, 16), 1024, None).await;
    post(&base, "/v1/chat/completions", &first).await;
    let (_, shared) = post(&base, "/v1/chat/completions", &second).await;
    let cached = &shared["usage"]["prompt_tokens_details"]["cached_tokens"];
    let prompt = &shared["usage"]["prompt_tokens"];
    // The template and the system prompt come from the cache (they end in
    // the middle of a prefill chunk); the question is prefilled.
    assert!(
        cached.as_u64().unwrap() >= 15 && cached.as_u64() < prompt.as_u64(),
        "{shared}"
    );
    let fresh = start(engine(1, 16), 1024, None).await;
    let (_, alone) = post(&fresh, "/v1/chat/completions", &second).await;
    assert_eq!(alone["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        alone["choices"][0]["logprobs"],
        shared["choices"][0]["logprobs"]
    );
    assert_eq!(reply(&alone), reply(&shared));
    // The same request again reuses all but its last two tokens, and still
    // gives the same bits.
    let (_, again) = post(&base, "/v1/chat/completions", &second).await;
    let n = prompt.as_u64().unwrap();
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"],
        n - 2
    );
    assert_eq!(
        alone["choices"][0]["logprobs"],
        again["choices"][0]["logprobs"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_arriving_together_compute_their_shared_prompt_once() {
    let system = format!(
        "You are terse. {}",
        "Never use more words than needed. ".repeat(20)
    );
    let ask = |question: &str| {
        json!({"messages": [{"role": "system", "content": system},
            {"role": "user", "content": question}], "temperature": 0, "max_tokens": 6,
            "logprobs": true, "top_logprobs": 2})
    };
    let reqs = [
        "Name a fruit.",
        "Name a tree.",
        "Name a bird.",
        "Name a fish.",
    ]
    .map(ask);
    let base = start(engine(4, 16), 1024, None).await;
    let tasks: Vec<_> = reqs
        .iter()
        .cloned()
        .map(|r| {
            let base = base.clone();
            tokio::spawn(async move { post(&base, "/v1/chat/completions", &r).await })
        })
        .collect();
    let mut together = Vec::new();
    for t in tasks {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        together.push(v);
    }
    // One request prefills the system prompt; the others copy it from its
    // slot once it is computed.
    let cached: Vec<u64> = together
        .iter()
        .map(|v| {
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(cached.iter().filter(|&&c| c == 0).count(), 1, "{cached:?}");
    assert!(cached.iter().all(|&c| c == 0 || c >= 150), "{cached:?}");
    let (_, metrics) = get(&base, "/metrics").await;
    let copied = metric(&metrics, "mllm_prefix_copied_tokens_total");
    assert!(copied >= 150.0, "{copied}");
    // Each equals the request alone on a fresh server, to the bit.
    for (r, v) in reqs.iter().zip(&together) {
        let fresh = start(engine(1, 16), 1024, None).await;
        let (_, alone) = post(&fresh, "/v1/chat/completions", r).await;
        assert_eq!(alone["choices"][0]["logprobs"], v["choices"][0]["logprobs"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after() {
    let base = start(engine(1, 1), 2048, None).await;
    let long = json!({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true,
        "temperature": 0, "stream": true});
    // The first request holds the only slot ...
    let r = client()
        .post(format!("{base}/v1/completions"))
        .json(&long)
        .send()
        .await
        .unwrap();
    let mut running = r.bytes_stream();
    running.next().await.unwrap().unwrap();
    // ... the second waits in the queue ...
    let waiting = tokio::spawn({
        let base = base.clone();
        async move {
            post(
                &base,
                "/v1/completions",
                &json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}),
            )
            .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, m) = get(&base, "/metrics").await;
        if metric(&m, "mllm_queue_length") == 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the second request never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and a third is turned away.
    let r = client()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    // Cancelling the first lets the queued one run.
    drop(running);
    let (status, v) = waiting.await.unwrap();
    assert_eq!(status, 200, "{v}");
}
