//! Opening dataset files (manifests, shards, indexes): regular files only, judged on the open
//! file itself. Its own module so that the manifest, the shard and the index readers and the
//! `--dataset-root` checks all use it without importing each other.

use std::path::Path;

/// Open `path` for reading only if it is a regular file, judged on the open file itself (no
/// window between a check and the open in which it could become a FIFO): opened without
/// blocking, so a FIFO or a device is refused instead of waited on.
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a device, a FIFO or a folder): datasets are files",
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO where a dataset file should be is refused at once; opening it used to block
    /// for ever (review of issue 19: a check before the open left a window to swap one in).
    #[test]
    fn a_fifo_is_refused_at_once_and_regular_files_open() {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let fifo = dir.path().join("shard.tar");
        let name = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap_or_else(|error| panic!("{error}"));
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
        let error = open_regular(&fifo).expect_err("a FIFO");
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let file = dir.path().join("file.tar");
        std::fs::write(&file, b"x").unwrap_or_else(|error| panic!("{error}"));
        assert!(open_regular(&file).is_ok());
    }
}
