//! Bounded reads of the files a config names (the config itself, API keys, tokens, TLS material,
//! tokenizers, timing tables): only regular files, and never more than a cap, so a path that
//! points at `/dev/zero`, a FIFO or a multi-gigabyte file is an error that names it, not a hang or
//! an exhausted memory.

use std::io::Read;
use std::path::Path;

/// Caps per kind of file: each is far above any real one.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// An API key or a lifecycle token.
pub const MAX_SECRET_BYTES: u64 = 64 << 10;
/// A PEM bundle (a CA bundle of a few hundred certificates is ~250 KiB).
pub const MAX_PEM_BYTES: u64 = 4 << 20;
/// A `tokenizer.json` (large vocabularies are ~10-30 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    #[error("it is not a regular file (a device, a FIFO or a directory)")]
    NotRegular,
    #[error("it is larger than the {0} bytes accepted")]
    TooLarge(u64),
    #[error("it is not UTF-8 text")]
    NotUtf8,
}

/// The bytes of the regular file at `path`, at most `max` of them.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    // Checked before opening: opening a FIFO would block until a writer appears.
    if !std::fs::metadata(path)?.is_file() {
        return Err(FileError::NotRegular);
    }
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    // One byte more than allowed tells a file of exactly `max` from a larger one.
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(FileError::TooLarge(max));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text(path: &Path, max: u64) -> Result<String, FileError> {
    String::from_utf8(read_bounded(path, max)?).map_err(|_| FileError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_directories_and_large_files_are_refused() {
        for special in ["/dev/zero", "/dev/urandom", "/"] {
            assert!(
                matches!(
                    read_bounded(Path::new(special), 10),
                    Err(FileError::NotRegular)
                ),
                "{special}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Returns at once: a FIFO is refused before it is opened.
        assert!(matches!(
            read_bounded(&fifo, 10),
            Err(FileError::NotRegular)
        ));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 11]).unwrap();
        assert!(matches!(
            read_bounded(&big, 10),
            Err(FileError::TooLarge(10))
        ));
        assert_eq!(read_bounded(&big, 11).unwrap().len(), 11);
        std::fs::write(&big, [0xff, 0xfe]).unwrap();
        assert!(matches!(read_text(&big, 10), Err(FileError::NotUtf8)));
        assert!(matches!(
            read_bounded(&dir.path().join("missing"), 10),
            Err(FileError::Io(_))
        ));
    }
}
