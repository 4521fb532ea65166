//! One self-contained HTML page: every table and every plot inline, no external assets.

use std::fmt::Write;

use super::report::Report;
use super::svg::{self, esc};
use super::tables;

/// Converts one rendered Markdown-style table into an HTML table.
fn html_table(text: &str) -> String {
    let mut out = String::from("<table>");
    for (i, line) in text.lines().enumerate() {
        if i == 1 {
            continue; // the |---| separator
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split(" |")
            .map(str::trim)
            .collect();
        let tag = if i == 0 { "th" } else { "td" };
        out.push_str("<tr>");
        for c in cells {
            let _ = write!(out, "<{tag}>{}</{tag}>", esc(c));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// The page.
pub fn page(r: &Report) -> String {
    let mut o = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tokenmeter analyze</title><style>\
         body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin-bottom:1.5em}\
         td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}</style></head><body>\
         <h1>tokenmeter analyze</h1>\n",
    );
    for (title, body) in tables::sections(r) {
        let _ = writeln!(o, "<h2>{}</h2>{}", esc(&title), html_table(&body));
    }
    o.push_str("<h2>Plots</h2>\n");
    for (_, s) in svg::all(r) {
        let _ = writeln!(o, "<div>{s}</div>");
    }
    o.push_str("</body></html>\n");
    o
}
