//! The official `openai` Python client against the server: a streamed and a
//! non-streamed chat (and a few more checks), run by
//! `scripts/openai_client_check.sh` in a throwaway virtual environment.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_works() {
    let base = start(engine(2, 16), 1024, Some("test-key")).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/openai_client_check.sh");
    let url = format!("{base}/v1");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(script)
            .arg(url)
            .args(["--api-key", "test-key"])
            .output()
            .expect("run bash")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(reason) = stdout.lines().find(|l| l.starts_with("SKIP")) {
        eprintln!("skipped: {reason}");
        return;
    }
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("checks passed"), "{stdout}");
}
