//! Every route of the server on the default model: answers, streams and
//! errors in OpenAI's shapes.

mod common;

use common::*;
use serde_json::{json, Value};

const CTX: usize = 512;

fn chat(content: &str) -> Value {
    json!({"model": "smollm2", "messages": [{"role": "user", "content": content}],
           "temperature": 0, "max_tokens": 48})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_streamed_and_not() {
    let base = start(engine(4, 16), CTX, None).await;
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &chat("What is the capital of France?"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "smollm2");
    let text = reply(&v);
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let usage = &v["usage"];
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    assert!(prompt > 10 && completion > 1, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + completion);

    // The same request streamed: the same text, the role first, the finish
    // reason last, then the usage chunk.
    let mut body = chat("What is the capital of France?");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = post_stream(&base, "/v1/chat/completions", &body).await;
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(streamed_text(&chunks), text);
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    // The second request reuses all but the last two prompt tokens (alone,
    // the last one shares its prefill chunk with the one before it).
    let mut usage = chunks[n - 1]["usage"].clone();
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        json!(prompt - 2)
    );
    usage["prompt_tokens_details"]["cached_tokens"] = json!(0);
    assert_eq!(usage, v["usage"]);
    // Without include_usage no usage chunk is sent.
    body["stream_options"] = json!({"include_usage": false});
    let chunks = post_stream(&base, "/v1/chat/completions", &body).await;
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));

    // `default` names the served model too; the model's chat template is used
    // for a system message and earlier turns.
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &json!({"model": "default", "temperature": 0,
        "max_completion_tokens": 8, "messages": [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"}]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stop_strings_logprobs_and_seeds() {
    let base = start(engine(4, 16), CTX, None).await;
    // Token ids or text; max_tokens ends the reply with `length`.
    let (_, ids) = post(
        &base,
        "/tokenize",
        &json!({"content": "The capital of France is"}),
    )
    .await;
    let ids = ids["tokens"].clone();
    assert!(ids.as_array().unwrap().len() >= 5);
    let (_, text) = post(&base, "/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(text["content"], "The capital of France is");
    let req = |prompt: Value| json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (s1, a) = post(&base, "/v1/completions", &req(ids.clone())).await;
    let (s2, b) = post(
        &base,
        "/v1/completions",
        &req(json!("The capital of France is")),
    )
    .await;
    assert_eq!((s1, s2), (200, 200), "{a} {b}");
    assert_eq!(a["object"], "text_completion");
    assert_eq!(reply(&a), reply(&b));
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    assert_eq!(a["usage"]["completion_tokens"], 12);
    let full = reply(&a);

    // A stop string inside the reply ends it just before the string, streamed
    // or not, however the string is split over tokens.
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let mut body = req(ids.clone());
    body["stop"] = json!(["@@never@@", stop]);
    let (_, v) = post(&base, "/v1/completions", &body).await;
    assert_eq!(reply(&v), expected);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let chunks = post_stream(&base, "/v1/completions", &body).await;
    assert_eq!(streamed_text(&chunks), expected);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    // Log-probabilities: one entry per token; greedy picks the top one.
    let (_, v) = post(
        &base,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0, "max_tokens": 6, "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
    let mut body = req(ids.clone());
    body["logprobs"] = json!(2);
    let (_, v) = post(&base, "/v1/completions", &body).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 12);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);

    // Sampling with a seed repeats; another seed differs.
    let sampled = |seed: u64| {
        json!({"prompt": ids.clone(), "max_tokens": 24, "temperature": 1.0,
        "top_k": 50, "seed": seed, "ignore_eos": true})
    };
    let (_, x) = post(&base, "/v1/completions", &sampled(7)).await;
    let (_, y) = post(&base, "/v1/completions", &sampled(7)).await;
    let (_, z) = post(&base, "/v1/completions", &sampled(8)).await;
    assert_eq!(reply(&x), reply(&y));
    assert_ne!(reply(&x), reply(&z));

    // Penalties are accepted and change a greedy reply that repeats itself.
    let rep = |p: f32| {
        json!({"prompt": "one one one one one", "max_tokens": 10, "temperature": 0,
        "frequency_penalty": p, "ignore_eos": true})
    };
    let (_, plain) = post(&base, "/v1/completions", &rep(0.0)).await;
    let (_, penal) = post(&base, "/v1/completions", &rep(2.0)).await;
    assert_ne!(reply(&plain), reply(&penal));
}

/// Asserts an OpenAI error answer with `status` that names `param`.
async fn expect_error(
    base: &str,
    path: &str,
    body: &Value,
    status: u16,
    param: Option<&str>,
) -> String {
    let (got, v) = post(base, path, body).await;
    assert_eq!(got, status, "{body} -> {v}");
    let e = &v["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
    assert_eq!(e["param"].as_str(), param, "{v}");
    e["message"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_named_errors_and_do_not_disturb_the_server() {
    let base = start(engine(2, 16), 64, None).await;
    let c = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    // Malformed JSON.
    let r = client()
        .post(format!("{base}{c}"))
        .header("content-type", "application/json")
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("malformed JSON"),
        "{v}"
    );
    // Wrong types, bad values, empty or missing messages.
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "temperature": "hot"}),
        400,
        Some("temperature"),
    )
    .await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "max_tokens": -3}),
        400,
        Some("max_tokens"),
    )
    .await;
    expect_error(&base, c, &json!({"messages": "hi"}), 400, Some("messages")).await;
    expect_error(&base, c, &json!({"messages": []}), 400, Some("messages")).await;
    expect_error(&base, c, &json!({"temperature": 0}), 400, Some("messages")).await;
    expect_error(
        &base,
        c,
        &json!({"messages": [{"role": "robot", "content": "x"}]}),
        400,
        Some("messages[0].role"),
    )
    .await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "temperature": -1}),
        400,
        Some("temperature"),
    )
    .await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "top_p": 1.5}),
        400,
        Some("top_p"),
    )
    .await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "min_p": 2}),
        400,
        Some("min_p"),
    )
    .await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "presence_penalty": 3}),
        400,
        Some("presence_penalty"),
    )
    .await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "repetition_penalty": 0}),
        400,
        Some("repetition_penalty"),
    )
    .await;
    expect_error(&base, c, &json!({"messages": msgs, "n": 2}), 400, Some("n")).await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "stop": [""]}),
        400,
        Some("stop"),
    )
    .await;
    expect_error(
        &base,
        c,
        &json!({"messages": msgs, "top_logprobs": 50, "logprobs": true}),
        400,
        Some("top_logprobs"),
    )
    .await;
    // The context is 64 tokens: a longer prompt, or a max_tokens past it.
    let long = "word ".repeat(80);
    let m = expect_error(
        &base,
        c,
        &json!({"messages": [{"role": "user", "content": long}]}),
        400,
        Some("messages"),
    )
    .await;
    assert!(m.contains("context holds 64"), "{m}");
    let m = expect_error(
        &base,
        c,
        &json!({"messages": msgs, "max_tokens": 60}),
        400,
        Some("max_tokens"),
    )
    .await;
    assert!(m.contains("context of 64 tokens"), "{m}");
    let p = "/v1/completions";
    expect_error(
        &base,
        p,
        &json!({"prompt": [1, 2, 99999999]}),
        400,
        Some("prompt"),
    )
    .await;
    expect_error(&base, p, &json!({"prompt": ""}), 400, Some("prompt")).await;
    expect_error(&base, p, &json!({"prompt": {"a": 1}}), 400, Some("prompt")).await;
    // Unknown model, unknown route, wrong method.
    let (status, v) = post(&base, c, &json!({"model": "gpt-4", "messages": msgs})).await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "model_not_found");
    let (status, v) = post(&base, "/v2/nothing", &json!({})).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, _) = get(&base, c).await;
    assert_eq!(status, 405);
    expect_error(
        &base,
        "/detokenize",
        &json!({"tokens": [4000000]}),
        400,
        Some("tokens"),
    )
    .await;
    // The server still answers, and counted the errors.
    let (status, v) = post(
        &base,
        c,
        &json!({"messages": msgs, "temperature": 0, "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (_, metrics) = get(&base, "/metrics").await;
    assert!(
        metric(&metrics, "mllm_request_errors_total") >= 20.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_metrics_page_and_api_key() {
    let base = start(engine(2, 16), CTX, Some("sekrit")).await;
    let (status, health) = get(&base, "/health").await;
    assert_eq!((status, health.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, page) = get(&base, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains("<html") && page.contains("/v1/chat/completions"));
    // Every API route needs the key.
    let (status, v) = get(&base, "/v1/models").await;
    assert_eq!(status, 401);
    assert!(v.contains("invalid_api_key"), "{v}");
    let (status, _) = post(&base, "/v1/chat/completions", &chat("hi")).await;
    assert_eq!(status, 401);
    let (status, _) = post(&base, "/tokenize", &json!({"content": "hi"})).await;
    assert_eq!(status, 401);
    let authed = |path: &str| client().get(format!("{base}{path}")).bearer_auth("sekrit");
    let models: Value = authed("/v1/models")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "smollm2");
    assert_eq!(models["data"][0]["object"], "model");
    let wrong = client()
        .get(format!("{base}/v1/models"))
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("sekrit")
        .json(&chat("What is 2+2?"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (_, metrics) = get(&base, "/metrics").await;
    for name in [
        "mllm_requests_total",
        "mllm_prompt_tokens_total",
        "mllm_completion_tokens_total",
        "mllm_queue_length",
        "mllm_active_sequences",
        "mllm_time_to_first_token_seconds_count",
        "mllm_inter_token_latency_seconds_count",
        "mllm_prefix_reused_tokens_total",
    ] {
        metric(&metrics, name);
    }
    assert_eq!(metric(&metrics, "mllm_requests_total"), 1.0);
    assert!(metric(&metrics, "mllm_completion_tokens_total") >= 1.0);
    assert_eq!(
        metric(&metrics, "mllm_time_to_first_token_seconds_count"),
        1.0
    );
    assert!(metrics.contains("mllm_inter_token_latency_seconds_bucket{le=\"+Inf\"}"));
}
