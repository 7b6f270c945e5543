//! Headless Chromium (Debian's `chromium`, which `scripts/test` installs) for the tests of the
//! pages the canary writes and serves: found on `PATH` or skipped loudly (failed in CI), run on
//! a URL with a profile of its own, its console messages, a screenshot's pixels.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a test without Chromium skips (`skip::missing_tool`: recorded, a failure in CI).
pub const MISSING: &str = "chromium is not installed: ./scripts/test installs Debian's";

/// Chromium's path, if it is on `PATH`.
pub fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        })
    })
}

/// Runs headless Chromium on `url` (`file://…` or `http://…`) with `extra` flags and its profile
/// in `profile`; returns (stdout, stderr).
pub fn headless(chromium: &Path, url: &str, profile: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `file://PATH`, for [`headless`].
pub fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Console messages in Chromium's log (`...:INFO:CONSOLE(...)] "message", source: ...`).
pub fn console_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(":CONSOLE")).collect()
}

/// A PNG screenshot's pixels and how many bytes each takes.
pub fn png_pixels(path: &Path) -> (Vec<u8>, usize) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (buf, info.color_type.samples())
}

/// How many of `pixels` (each `channels` bytes) are within `tolerance` of `rgb` in every channel.
pub fn count_colour(pixels: &[u8], channels: usize, rgb: [u8; 3], tolerance: u8) -> usize {
    pixels
        .chunks(channels)
        .filter(|p| p.iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= tolerance))
        .count()
}
