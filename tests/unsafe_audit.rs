//! Where `unsafe` may appear, and that each use says why it holds: only
//! the SIMD kernels, the memory map and the CUDA driver probe use it, and
//! every `unsafe` block or impl has a `// SAFETY:` comment just above it
//! (every `unsafe fn` a `# Safety` section).

use std::path::{Path, PathBuf};

/// The files allowed to hold `unsafe` code (a directory ends in `/`).
const ALLOWED: [&str; 3] = [
    "mllm-ops/src/cpu/kernels/",
    "mllm-core/src/file/mapped.rs",
    "mllm-ops/src/cuda.rs",
];

/// How many lines above an `unsafe` the comment may start.
const REACH: usize = 8;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file of the workspace's crates (not build output, not the
/// fuzz crate's generated files, not this file).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), "target" | "corpus" | "artifacts" | ".git") {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") && !path.ends_with("tests/unsafe_audit.rs") {
            out.push(path);
        }
    }
}

/// The `unsafe` uses of `source` as (line number, kind): kind is "fn" for
/// an `unsafe fn`, "block" for a block or impl. Comment lines and lints
/// naming `unsafe_*` are not uses.
fn unsafe_uses(source: &str) -> Vec<(usize, &'static str)> {
    let mut uses = Vec::new();
    for (i, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let Some(at) = code.find("unsafe") else {
            continue;
        };
        let rest = &code[at + "unsafe".len()..];
        if rest.starts_with('_') || code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = rest.trim_start();
        let kind = if rest.starts_with("fn") || rest.starts_with("extern") {
            "fn"
        } else {
            "block"
        };
        uses.push((i, kind));
    }
    uses
}

fn justified(lines: &[&str], at: usize, kind: &str) -> bool {
    let window = &lines[at.saturating_sub(REACH)..=at];
    match kind {
        "fn" => window
            .iter()
            .any(|l| l.contains("# Safety") || l.contains("SAFETY:")),
        _ => window.iter().any(|l| l.contains("SAFETY:")),
    }
}

#[test]
fn unsafe_code_is_only_where_allowed_and_always_justified() {
    let root = root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 100, "found only {} files", files.len());
    let mut uses = 0;
    let mut problems = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let source = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = source.lines().collect();
        for (at, kind) in unsafe_uses(&source) {
            uses += 1;
            if !ALLOWED.iter().any(|a| rel.starts_with(a)) {
                problems.push(format!(
                    "{rel}:{}: unsafe outside the kernels and the map",
                    at + 1
                ));
            } else if !justified(&lines, at, kind) {
                problems.push(format!(
                    "{rel}:{}: unsafe {kind} without a SAFETY comment",
                    at + 1
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The kernels do use it: a scan that found nothing would prove nothing.
    assert!(uses > 20, "only {uses} uses of unsafe found");
}

#[test]
fn the_scan_finds_unjustified_and_misplaced_unsafe() {
    let source = "fn f() {\n    let x = unsafe { g() };\n}\n// SAFETY: fine\nlet y = unsafe { h() };\n#![deny(unsafe_op_in_unsafe_fn)]\nlet z = 1; // an unsafe word in a comment\n";
    assert_eq!(unsafe_uses(source), [(1, "block"), (4, "block")]);
    let lines: Vec<&str> = source.lines().collect();
    assert!(!justified(&lines, 1, "block"));
    assert!(justified(&lines, 4, "block"));
    let fns = "/// # Safety\n/// The caller checks AVX2.\npub unsafe fn k() {}\n\n\n\n\n\n\n\n\n\npub unsafe fn m() {}\n";
    assert_eq!(unsafe_uses(fns), [(2, "fn"), (12, "fn")]);
    let lines: Vec<&str> = fns.lines().collect();
    assert!(justified(&lines, 2, "fn"));
    assert!(!justified(&lines, 12, "fn"));
}
