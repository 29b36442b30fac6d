//! Atomic file writes: content goes to a temporary file in the destination's
//! directory, which is synced and renamed over the destination only when
//! complete. A crash or error leaves the old file (or nothing) in place.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::{Error, Result};

/// Writes `path` atomically; `fill` writes the content.
pub fn write_atomically<F>(path: &Path, fill: F) -> Result<()>
where
    F: FnOnce(&mut BufWriter<&File>) -> Result<()>,
{
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        Error::InvalidInput(format!("output path {} has no file name", path.display()))
    })?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, e))?;
    let io = |e| Error::io(tmp.path(), e);
    {
        let mut out = BufWriter::new(tmp.as_file());
        fill(&mut out)?;
        out.flush().map_err(io)?;
    }
    // Temporary files are private (0600); the result gets ordinary
    // permissions, as a file created with `File::create` would.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::Permissions::from_mode(0o644);
        tmp.as_file().set_permissions(perms).map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_only_on_success() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        write_atomically(&path, |w| {
            w.write_all(b"one").map_err(|e| Error::io("f", e))
        })
        .unwrap();
        let err = write_atomically(&path, |w| {
            w.write_all(b"partial").map_err(|e| Error::io("f", e))?;
            Err(Error::InvalidInput("stop".into()))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}
