//! Input files: plain or gzip (by magic bytes), stdin spooled to a temporary file so it can be
//! read twice, and a line reader that reuses one buffer and caps line length.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

/// Longest line kept (1 MiB); longer lines are skipped whole and counted as bad.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One input as named in the report, and where its bytes are.
#[derive(Debug)]
pub struct Source {
    /// The name given on the command line (`-` for stdin).
    pub name: String,
    /// The file to read (the spool file for stdin).
    pub path: PathBuf,
    /// Whether `path` is a spool file to delete when done.
    spooled: bool,
}

impl Drop for Source {
    fn drop(&mut self) {
        if self.spooled {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Source {
    /// A source for `arg`: a path, or `-` for stdin (copied to a temporary file now).
    pub fn open_arg(arg: &Path) -> anyhow::Result<Source> {
        if arg.as_os_str() == "-" {
            return Source::spool(&mut io::stdin().lock(), "-");
        }
        Ok(Source {
            name: arg.display().to_string(),
            path: arg.to_path_buf(),
            spooled: false,
        })
    }

    /// Copies `from` into a temporary file (the second pass needs to read it again).
    pub fn spool(from: &mut impl Read, name: &str) -> anyhow::Result<Source> {
        let unique = format!(
            "tokenmeter-analyze-{}-{}.spool",
            std::process::id(),
            crate::clock::Clock::global().now()
        );
        let path = std::env::temp_dir().join(unique);
        let mut file = File::create(&path)?;
        let source = Source {
            name: name.to_string(),
            path,
            spooled: true,
        };
        io::copy(from, &mut file)?;
        file.flush()?;
        Ok(source)
    }

    /// A buffered reader over the decompressed bytes (gzip detected by its magic bytes).
    pub fn reader(&self) -> io::Result<Box<dyn BufRead + Send>> {
        let mut file = BufReader::with_capacity(1 << 16, File::open(&self.path)?);
        let gz = file.fill_buf()?.starts_with(&[0x1f, 0x8b]);
        Ok(if gz {
            Box::new(BufReader::with_capacity(1 << 16, MultiGzDecoder::new(file)))
        } else {
            Box::new(file)
        })
    }
}

/// One line as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// The line's bytes, newline (and a trailing CR) removed.
    Text(&'a [u8]),
    /// The line exceeded [`MAX_LINE_BYTES`]; its bytes were dropped.
    TooLong,
}

/// Splits a reader into lines, reusing one buffer; line numbers start at 1.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    line_no: u64,
    max: usize,
}

impl<R: BufRead> LineReader<R> {
    /// A line reader with the default length cap.
    pub fn new(inner: R) -> Self {
        LineReader::with_max(inner, MAX_LINE_BYTES)
    }

    /// A line reader with a custom length cap.
    pub fn with_max(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::with_capacity(4096),
            line_no: 0,
            max,
        }
    }

    /// The next line and its number, or `None` at the end.
    pub fn next_line(&mut self) -> io::Result<Option<(u64, Line<'_>)>> {
        self.buf.clear();
        let mut too_long = false;
        let mut any = false;
        loop {
            let avail = self.inner.fill_buf()?;
            if avail.is_empty() {
                if !any {
                    return Ok(None);
                }
                break;
            }
            any = true;
            let (take, done) = match memchr_newline(avail) {
                Some(i) => (i, true),
                None => (avail.len(), false),
            };
            if !too_long && self.buf.len() + take <= self.max {
                self.buf.extend_from_slice(&avail[..take]);
            } else {
                too_long = true;
                self.buf.clear();
            }
            self.inner.consume(if done { take + 1 } else { take });
            if done {
                break;
            }
        }
        self.line_no += 1;
        if too_long {
            return Ok(Some((self.line_no, Line::TooLong)));
        }
        let text = self.buf.strip_suffix(b"\r").unwrap_or(&self.buf);
        Ok(Some((self.line_no, Line::Text(text))))
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_capped_and_numbered() {
        let data = b"a\r\n\nlong-line-here\nlast".to_vec();
        let mut r = LineReader::with_max(BufReader::with_capacity(3, &data[..]), 8);
        let mut got = vec![];
        while let Some((n, l)) = r.next_line().unwrap() {
            got.push((
                n,
                match l {
                    Line::Text(t) => String::from_utf8(t.to_vec()).unwrap(),
                    Line::TooLong => "<too long>".into(),
                },
            ));
        }
        let want: Vec<(u64, String)> = vec![
            (1, "a".into()),
            (2, "".into()),
            (3, "<too long>".into()),
            (4, "last".into()),
        ];
        assert_eq!(got, want);
    }
}
