//! Table cells and their aligned text: the shape every section of the report takes.

use std::fmt::Write;

/// Formats an optional number with `decimals` places, `—` when unknown.
pub fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "—".to_string(),
    }
}

/// A table's cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

/// A grid from headers and rows.
pub fn grid(headers: &[&str], rows: &[Vec<String>]) -> Grid {
    Grid {
        headers: headers
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        rows: rows.to_vec(),
    }
}

/// A table with aligned columns.
pub fn table(headers: &[String], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::from("|");
        for (cell, w) in cells.zip(&widths) {
            let pad = w.saturating_sub(cell.chars().count());
            let _ = write!(s, " {cell}{} |", " ".repeat(pad));
        }
        s.push('\n');
        s
    };
    let mut out = line(&mut headers.iter().map(String::as_str));
    out.push('|');
    for w in &widths {
        let _ = write!(out, "{}|", "-".repeat(w + 2));
    }
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}
