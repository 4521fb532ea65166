//! The settings reference in step with the code: every key of `ServeConfig` (read by serialising
//! its `Default`, nested sections and `[[upstreams]]` included) is a row of the one settings
//! table in `docs/configuration.md`, with the code's default; every row names a key of the code;
//! the example config `config/tokenmeter.toml` lists every key (commented-out examples count)
//! with the code's default; `deploy/tokenmeter.toml` uses only keys of the code. A key missing on
//! either side fails with its name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;
use tokenmeter::config::ServeConfig;

fn read(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The code's settings: dotted key → default. A nested struct is a section and is walked; an
/// empty object is a map whose keys the operator chooses (`users.api_keys`) and is one setting;
/// an array of objects (`[[upstreams]]`) contributes `name[].field` for each field of its
/// element, read from a config that has one.
fn code_settings() -> BTreeMap<String, Value> {
    // The defaults but for one upstream (every key not given takes its default).
    let with_upstream: ServeConfig =
        toml::from_str("[[upstreams]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    let full = serde_json::to_value(&with_upstream).unwrap();
    let defaults = serde_json::to_value(ServeConfig::default()).unwrap();
    let mut out = BTreeMap::new();
    walk_code("", &full, &defaults, &mut out);
    out
}

fn walk_code(prefix: &str, v: &Value, default: &Value, out: &mut BTreeMap<String, Value>) {
    let obj = v.as_object().expect("a section serialises as an object");
    for (k, child) in obj {
        let key = format!("{prefix}{k}");
        let def = default.get(k).cloned().unwrap_or(Value::Null);
        match child {
            Value::Object(m) if !m.is_empty() => walk_code(&format!("{key}."), child, &def, out),
            Value::Array(items) if items.first().is_some_and(Value::is_object) => {
                for field in items[0].as_object().unwrap().keys() {
                    // An array of tables is empty by default: its fields have no default.
                    out.insert(format!("{key}[].{field}"), Value::Array(vec![]));
                }
            }
            _ => {
                out.insert(key, def);
            }
        }
    }
}

/// The rows of the settings table (the first table after `## Settings`): key → default cell.
/// A first cell may name several keys: `` `tls.cert_file`, `tls.key_file` `` or
/// `` `ttft_for_non_streamed.chat`, `.completions` `` (a leading dot: the first key's section).
fn table_settings(doc: &str) -> Vec<(String, String)> {
    let start = doc
        .find("\n## Settings\n")
        .expect("docs/configuration.md has a `## Settings` section");
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc[start..].lines().skip(2) {
        if !line.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        in_table = true;
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        if cells[0] == "key" || cells[0].starts_with("---") {
            continue;
        }
        assert_eq!(
            cells.len(),
            3,
            "a settings row has key | default | meaning: {line}"
        );
        let names: Vec<&str> = cells[0].split('`').skip(1).step_by(2).collect();
        assert!(
            !names.is_empty(),
            "a settings row names its key in backticks: {line}"
        );
        let section = names[0].rsplit_once('.').map_or("", |(s, _)| s);
        for n in names {
            let key = if let Some(rest) = n.strip_prefix('.') {
                format!("{section}.{rest}")
            } else {
                n.to_string()
            };
            rows.push((key, cells[1].to_string()));
        }
    }
    rows
}

/// Does a table's default cell say the code's default? `unset` is null, `empty` an empty list or
/// map; numbers compare as numbers; a string may be written with or without backticks.
fn cell_matches(cell: &str, code: &Value) -> bool {
    let cell = cell.trim_matches('`');
    match code {
        Value::Null => cell == "unset",
        Value::Bool(b) => cell == b.to_string(),
        Value::Number(n) => cell.parse::<f64>().ok() == n.as_f64(),
        Value::String(s) => cell == s,
        Value::Array(a) if a.is_empty() => cell.starts_with("empty"),
        Value::Object(o) if o.is_empty() => cell.starts_with("empty"),
        Value::Array(_) => serde_json::from_str::<Value>(cell).ok().as_ref() == Some(code),
        Value::Object(_) => false,
    }
}

#[test]
fn every_setting_of_the_code_is_one_row_of_the_reference_table_with_its_default() {
    let code = code_settings();
    assert!(
        code.contains_key("meter.windows_s") && code.contains_key("slo.max_tpot_ms"),
        "{code:?}"
    );
    let doc = read("docs/configuration.md");
    let rows = table_settings(&doc);
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for (key, cell) in &rows {
        if !seen.insert(key.clone()) {
            problems.push(format!("{key}: in the table twice"));
        }
        match code.get(key) {
            None => problems.push(format!("{key}: in the table, not a setting of the code")),
            Some(def) if !cell_matches(cell, def) => problems.push(format!(
                "{key}: the table's default is {cell}, the code's {def}"
            )),
            Some(_) => {}
        }
    }
    for key in code.keys() {
        if !seen.contains(key) {
            problems.push(format!(
                "{key}: a setting of the code, missing from docs/configuration.md"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "settings table out of step:\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_other_page_has_a_settings_table() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut pages = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") && !p.ends_with("configuration.md") {
            pages.push(p);
        }
    }
    for p in pages {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains("| key | default | meaning |"),
            "{}: settings belong in docs/configuration.md's one table",
            p.display()
        );
    }
}

/// `config/tokenmeter.toml` with its commented-out examples (`# key = value`, `# [[upstreams]]`)
/// taken in: every setting, as the file documents it.
fn example_with_commented_keys() -> String {
    let assignment = |s: &str| {
        let Some((k, v)) = s.split_once(" = ") else {
            return false;
        };
        let v = v.trim();
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
            && (v == "true"
                || v == "false"
                || v.parse::<f64>().is_ok()
                || (v.starts_with('"') && v.ends_with('"') && v.matches('"').count() == 2)
                || (v.starts_with('[') && v.ends_with(']')))
    };
    // An `[[upstreams]]` example and its keys go to the end, where they open no section that
    // would take the file's later top-level keys in.
    let (mut body, mut tables) = (Vec::new(), Vec::new());
    let mut in_table = false;
    for l in read("config/tokenmeter.toml").lines() {
        match l.strip_prefix("# ") {
            Some("[[upstreams]]") => {
                in_table = true;
                tables.push("[[upstreams]]".to_string());
            }
            Some(rest) if assignment(rest) => {
                let to = if in_table { &mut tables } else { &mut body };
                to.push(rest.to_string());
            }
            _ => {
                in_table = false;
                body.push(l.to_string());
            }
        }
    }
    body.extend(tables);
    body.join("\n")
}

/// Dotted keys of a TOML document, walked as the code's settings are (a code leaf stops the walk).
fn toml_keys(
    prefix: &str,
    v: &toml::Value,
    code: &BTreeMap<String, Value>,
    out: &mut BTreeMap<String, toml::Value>,
) {
    for (k, child) in v.as_table().unwrap() {
        let key = format!("{prefix}{k}");
        match child {
            toml::Value::Table(_) if !code.contains_key(&key) => {
                toml_keys(&format!("{key}."), child, code, out);
            }
            toml::Value::Array(items) if items.first().is_some_and(toml::Value::is_table) => {
                for item in items {
                    for field in item.as_table().unwrap().keys() {
                        out.insert(format!("{key}[].{field}"), toml::Value::Array(vec![]));
                    }
                }
            }
            _ => {
                out.insert(key, child.clone());
            }
        }
    }
}

#[test]
fn the_example_config_lists_every_setting_with_the_codes_default() {
    let code = code_settings();
    let text = example_with_commented_keys();
    toml::from_str::<ServeConfig>(&text).unwrap_or_else(|e| panic!("config/tokenmeter.toml: {e}"));
    let doc: toml::Value = toml::from_str(&text).unwrap();
    let mut example = BTreeMap::new();
    toml_keys("", &doc, &code, &mut example);
    let mut problems = Vec::new();
    for key in code.keys() {
        if !example.contains_key(key) {
            problems.push(format!(
                "{key}: a setting of the code, missing from config/tokenmeter.toml"
            ));
        }
    }
    // Uncommented lines are the defaults: the file is the reference an operator copies from.
    let plain: toml::Value = toml::from_str(&read("config/tokenmeter.toml")).unwrap();
    let mut active = BTreeMap::new();
    toml_keys("", &plain, &code, &mut active);
    for (key, value) in &active {
        let Some(def) = code.get(key) else {
            problems.push(format!(
                "{key}: in config/tokenmeter.toml, not a setting of the code"
            ));
            continue;
        };
        let value = serde_json::to_value(value).unwrap();
        let same = match (&value, def) {
            (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
            (Value::Object(a), Value::Object(b)) => a.is_empty() && b.is_empty(),
            _ => &value == def,
        };
        if !same {
            problems.push(format!(
                "{key}: config/tokenmeter.toml says {value}, the code's default is {def}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "example config out of step:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_deployment_config_uses_only_settings_of_the_code() {
    let code = code_settings();
    let text = read("deploy/tokenmeter.toml");
    toml::from_str::<ServeConfig>(&text).unwrap_or_else(|e| panic!("deploy/tokenmeter.toml: {e}"));
    let mut keys = BTreeMap::new();
    toml_keys("", &toml::from_str(&text).unwrap(), &code, &mut keys);
    assert!(!keys.is_empty());
    let unknown: Vec<_> = keys.keys().filter(|k| !code.contains_key(*k)).collect();
    assert!(
        unknown.is_empty(),
        "deploy/tokenmeter.toml: not settings of the code: {unknown:?}"
    );
}
