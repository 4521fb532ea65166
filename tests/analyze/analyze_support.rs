//! Helpers shared by the analyze tests: temporary directories and log files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use tokenmeter::record::RequestRecord;

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates a unique directory under the system temp dir.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tm-analyze-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// A path inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The records as JSON lines.
pub fn lines_of(records: &[RequestRecord]) -> Vec<u8> {
    records
        .iter()
        .flat_map(tokenmeter::record::RequestRecord::to_json_line)
        .collect()
}

/// Writes `bytes` to `path` and returns the path.
pub fn write(path: &Path, bytes: &[u8]) -> PathBuf {
    std::fs::write(path, bytes).unwrap();
    path.to_path_buf()
}

/// Whether two floats agree to 1e-9 relative.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}
