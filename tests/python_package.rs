//! The Python module `mllm_rs` (mllm-python/): `scripts/test_python.sh`
//! builds its wheel into a throwaway virtual environment and runs its
//! pytest suite (tiny-model parity, SmolLM2 chat, streaming, errors,
//! threads, Ctrl-C). Skipped, with the printed reason, only where python3,
//! venv or pip is missing.

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_package_passes_its_tests() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test_python.sh");
    let out = Command::new("bash").arg(&script).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{stderr}",
        script.display()
    );
    if stdout.starts_with("SKIP:") {
        return;
    }
    assert!(stdout.contains(" passed"), "{stdout}");
    assert!(!stdout.contains("failed"), "{stdout}");
}
