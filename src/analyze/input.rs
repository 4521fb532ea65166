//! Input files: plain or gzip (by magic bytes) or stdin, and a line reader that reuses one buffer
//! and caps line length.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

/// Longest line kept (1 MiB); longer lines are skipped whole and counted as bad.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One input as named in the report, and where its bytes are.
#[derive(Debug)]
pub struct Source {
    /// The name given on the command line (`-` for stdin).
    pub name: String,
    /// The file to read; `None` for stdin (read once: `analyze` parses every input only once).
    pub path: Option<PathBuf>,
}

impl Source {
    /// A source for `arg`: a path, or `-` for stdin.
    pub fn open_arg(arg: &Path) -> Source {
        let stdin = arg.as_os_str() == "-";
        Source {
            name: arg.display().to_string(),
            path: (!stdin).then(|| arg.to_path_buf()),
        }
    }

    /// A buffered reader over the decompressed bytes (gzip detected by its magic bytes).
    pub fn reader(&self) -> io::Result<Box<dyn BufRead + Send>> {
        let raw: Box<dyn Read + Send> = match &self.path {
            Some(p) => Box::new(File::open(p)?),
            None => Box::new(io::stdin()),
        };
        let mut buffered = BufReader::with_capacity(1 << 16, raw);
        let gz = buffered.fill_buf()?.starts_with(&[0x1f, 0x8b]);
        Ok(if gz {
            Box::new(BufReader::with_capacity(
                1 << 16,
                MultiGzDecoder::new(buffered),
            ))
        } else {
            Box::new(buffered)
        })
    }
}

/// Stands in for a line longer than [`MAX_LINE_BYTES`] (its bytes are dropped); a real line
/// with exactly these bytes would also be counted as bad, only under another reason.
pub const TOO_LONG_PLACEHOLDER: &[u8] = b"\0\0tokenmeter:line-too-long\0\0";

/// Most bytes a chunk collects before it is handed on.
pub const CHUNK_BYTES: usize = 1 << 20;

/// A run of whole lines of one source, each ending in `\n`.
#[derive(Debug)]
pub struct Chunk {
    /// Index of the source.
    pub source: usize,
    /// Number of the chunk's first line (from 1).
    pub first_line: u64,
    /// The lines.
    pub data: Vec<u8>,
}

impl Chunk {
    /// The lines with their numbers (newline and one trailing CR removed).
    pub fn lines(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        let body = self.data.strip_suffix(b"\n").unwrap_or(&self.data);
        body.split(|&b| b == b'\n')
            .enumerate()
            .filter(move |_| !self.data.is_empty())
            .map(move |(i, l)| {
                (
                    self.first_line + i as u64,
                    l.strip_suffix(b"\r").unwrap_or(l),
                )
            })
    }
}

/// Cuts a reader into chunks of whole lines, replacing over-long lines by a placeholder.
pub struct Chunker<R> {
    inner: R,
    source: usize,
    pending: Vec<u8>,
    lines: u64,
    skipping: bool,
    done: bool,
    error: Option<io::Error>,
}

fn newlines(b: &[u8]) -> u64 {
    b.iter().filter(|&&c| c == b'\n').count() as u64
}

impl<R: BufRead> Chunker<R> {
    /// A chunker over source number `source`.
    pub fn new(inner: R, source: usize) -> Self {
        Chunker {
            inner,
            source,
            pending: Vec::new(),
            lines: 0,
            skipping: false,
            done: false,
            error: None,
        }
    }

    fn placeholder(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(TOO_LONG_PLACEHOLDER);
        out.push(b'\n');
        self.lines += 1;
    }

    /// The next chunk, or `None` at the end of the input.
    pub fn next_chunk(&mut self) -> io::Result<Option<Chunk>> {
        // A read error is reported after the lines read before it were handed on.
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.done {
            return Ok(None);
        }
        let first_line = self.lines + 1;
        let mut out = Vec::with_capacity(CHUNK_BYTES + (1 << 16));
        while out.len() < CHUNK_BYTES {
            let avail = match self.inner.fill_buf() {
                Ok(a) => a,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.done = true;
                    if out.is_empty() {
                        return Err(e);
                    }
                    self.error = Some(e);
                    break;
                }
            };
            let n = avail.len();
            if n == 0 {
                self.done = true;
                if self.skipping {
                    self.skipping = false;
                    self.placeholder(&mut out);
                } else if !self.pending.is_empty() {
                    out.append(&mut self.pending);
                    out.push(b'\n');
                    self.lines += 1;
                }
                break;
            }
            let first_nl = avail.iter().position(|&c| c == b'\n');
            if self.skipping {
                match first_nl {
                    Some(i) => {
                        self.inner.consume(i + 1);
                        self.skipping = false;
                        self.placeholder(&mut out);
                    }
                    None => self.inner.consume(n),
                }
                continue;
            }
            let Some(first) = first_nl else {
                self.pending.extend_from_slice(avail);
                self.inner.consume(n);
                if self.pending.len() > MAX_LINE_BYTES {
                    self.pending.clear();
                    self.skipping = true;
                }
                continue;
            };
            let last = avail.iter().rposition(|&c| c == b'\n').unwrap_or(first);
            let tail_start = if self.pending.len() + first > MAX_LINE_BYTES {
                self.pending.clear();
                first + 1
            } else {
                0
            };
            if tail_start > 0 {
                out.extend_from_slice(TOO_LONG_PLACEHOLDER);
                out.push(b'\n');
            } else {
                out.append(&mut self.pending);
            }
            // Lines wholly inside one buffer fill are shorter than the cap (64 KiB < 1 MiB).
            let avail = &avail[..n];
            out.extend_from_slice(&avail[tail_start..=last]);
            self.lines += newlines(&avail[..=last]);
            self.pending.extend_from_slice(&avail[last + 1..]);
            self.inner.consume(n);
        }
        if out.is_empty() {
            return Ok(None);
        }
        Ok(Some(Chunk {
            source: self.source,
            first_line,
            data: out,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_lines(data: &[u8], cap: usize) -> Vec<(u64, Vec<u8>)> {
        let mut c = Chunker::new(BufReader::with_capacity(cap, data), 0);
        let mut got = vec![];
        while let Some(chunk) = c.next_chunk().unwrap() {
            got.extend(chunk.lines().map(|(n, l)| (n, l.to_vec())));
        }
        got
    }

    #[test]
    fn chunks_keep_line_numbers_and_replace_over_long_lines() {
        let mut data = b"a\r\n\nbb\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        data.extend_from_slice(b"\nlast");
        for cap in [3, 64, 1 << 16] {
            let got = all_lines(&data, cap);
            let want: Vec<(u64, Vec<u8>)> = vec![
                (1, b"a".to_vec()),
                (2, b"".to_vec()),
                (3, b"bb".to_vec()),
                (4, TOO_LONG_PLACEHOLDER.to_vec()),
                (5, b"last".to_vec()),
            ];
            assert_eq!(got, want, "buffer {cap}");
        }
        assert!(all_lines(b"", 8).is_empty());
        assert_eq!(all_lines(b"x\n", 8), vec![(1, b"x".to_vec())]);
    }
}
