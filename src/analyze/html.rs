//! One self-contained HTML page: every table and every plot inline, no external assets.

use std::fmt::Write;

use super::report::Report;
use super::svg::{self, esc};
use super::tables::{self, Grid};

/// One grid as an HTML table, every cell escaped.
fn html_table(g: &Grid) -> String {
    let mut out = String::from("<table><tr>");
    for h in &g.headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>");
    for row in &g.rows {
        out.push_str("<tr>");
        for c in row {
            let _ = write!(out, "<td>{}</td>", esc(c));
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
    for (title, g) in tables::sections(r) {
        let _ = writeln!(o, "<h2>{}</h2>{}", esc(&title), html_table(&g));
    }
    o.push_str("<h2>Plots</h2>\n");
    for (_, s) in svg::all(r) {
        let _ = writeln!(o, "<div>{s}</div>");
    }
    o.push_str("</body></html>\n");
    o
}
