//! From the file, the environment and the flags to a `ServeConfig`, with every key-level problem
//! collected: serde stops at the first unknown key or ill-typed value, so a file with two mistakes
//! would otherwise take two runs to fix. Each problem's key is taken out of the table and the rest read
//! again, so one run names them all.

use serde_path_to_error::Segment;

use std::path::PathBuf;

use anyhow::Context;

use super::{InvalidConfig, ServeArgs, ServeConfig, ENV_PREFIX, ENV_RESERVED};

/// More problems than any real file has; bounds the re-reads of a pathological one.
const MAX_PROBLEMS: usize = 64;

/// Reads `table` into a config, naming every unknown key and ill-typed value as
/// `key.path: message`. The config holds the defaults where a problem's key was taken out; it is
/// `None` only when no key could be taken out to get past a problem.
pub(super) fn read(mut table: toml::Table) -> (Option<ServeConfig>, Vec<String>) {
    let mut problems = Vec::new();
    loop {
        let value = toml::Value::Table(table.clone());
        match serde_path_to_error::deserialize::<_, ServeConfig>(value) {
            Ok(config) => return (Some(config), problems),
            Err(e) => {
                let path = e.path().to_string();
                let message = e.inner().to_string();
                // toml adds "in `key`" on a line of its own; the path already says where.
                let message = message.lines().next().unwrap_or_default().trim();
                problems.push(if path == "." {
                    format!("config: {message}")
                } else {
                    format!("{path}: {message}")
                });
                let segments: Vec<&Segment> = e.path().iter().collect();
                if problems.len() >= MAX_PROBLEMS || !remove(&mut table, &segments) {
                    return (None, problems);
                }
            }
        }
    }
}

/// Takes out the key a problem is at: the deepest map key on `path` before any list index (a bad
/// element takes its whole list, which then keeps its default). False when there is none.
fn remove(table: &mut toml::Table, path: &[&Segment]) -> bool {
    let keys: Vec<&str> = path
        .iter()
        .map_while(|s| match s {
            Segment::Map { key } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = keys.split_last() else {
        return false;
    };
    let mut t = table;
    for p in parents {
        match t.get_mut(*p).and_then(toml::Value::as_table_mut) {
            Some(inner) => t = inner,
            None => return false,
        }
    }
    t.remove(*last).is_some()
}

/// Builds the config without checking values beyond their types: the config (`None` when it
/// could not be read at all) and every unknown key and ill-typed value. An unreadable file or a
/// malformed flag is an error at once.
pub(super) fn build(
    args: &ServeArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<(Option<ServeConfig>, Vec<String>)> {
    let env: Vec<(String, String)> = env.into_iter().collect();
    let path = args.config.clone().or_else(|| {
        env.iter()
            .find(|(k, _)| k == "TOKENMETER_CONFIG")
            .map(|(_, v)| PathBuf::from(v))
    });
    let mut table = match &path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            text.parse::<toml::Table>()
                .with_context(|| format!("parsing {}", p.display()))?
        }
        None => toml::Table::new(),
    };
    for (k, v) in &env {
        let Some(rest) = k.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if ENV_RESERVED.contains(&k.as_str()) || rest.is_empty() {
            continue;
        }
        let key = rest.to_ascii_lowercase().replace("__", ".");
        set_path(&mut table, &key, v).with_context(|| format!("environment variable {k}"))?;
    }
    let mut flag = |key: &str, v: Option<String>| -> anyhow::Result<()> {
        if let Some(v) = v {
            table_set(&mut table, key, toml::Value::String(v))?;
        }
        Ok(())
    };
    flag("listen", args.listen.clone())?;
    flag("upstream", args.upstream.clone())?;
    flag(
        "access_log",
        args.access_log.as_ref().map(|p| p.display().to_string()),
    )?;
    flag("admin_listen", args.admin_listen.clone())?;
    for kv in &args.set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set {kv}: expected KEY=VALUE"))?;
        set_path(&mut table, k.trim(), v).with_context(|| format!("--set {k}"))?;
    }
    Ok(read(table))
}

/// Sets a dotted key to a raw value: TOML syntax when it parses as TOML, else a plain string.
fn set_path(table: &mut toml::Table, key: &str, raw: &str) -> anyhow::Result<()> {
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    table_set(table, key, value)
}

fn table_set(table: &mut toml::Table, key: &str, value: toml::Value) -> anyhow::Result<()> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts
        .pop()
        .filter(|s| !s.is_empty())
        .with_context(|| format!("empty key `{key}`"))?;
    let mut t = table;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .with_context(|| format!("`{p}` is not a table"))?;
    }
    t.insert(last.to_string(), value);
    Ok(())
}

/// The config when there is no problem, else every problem in one [`InvalidConfig`] error.
pub(super) fn finish(
    config: Option<ServeConfig>,
    problems: Vec<String>,
) -> anyhow::Result<ServeConfig> {
    match (one_error(problems), config) {
        (Some(e), _) => Err(e.context(InvalidConfig)),
        (None, Some(c)) => Ok(c),
        (None, None) => Err(anyhow::anyhow!("config: unreadable").context(InvalidConfig)),
    }
}

/// `problems` as one error: the problem itself when there is one, else `N problems:` and one
/// per line; `None` when there is none.
pub(super) fn one_error(problems: Vec<String>) -> Option<anyhow::Error> {
    match problems.len() {
        0 => None,
        1 => Some(anyhow::anyhow!("{}", problems[0])),
        n => Some(anyhow::anyhow!(
            "{n} problems:\n  {}",
            problems.join("\n  ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_problem_is_named_in_one_read() {
        let table: toml::Table = "listne = 1\nmax_header_bytes = \"big\"\n[timeouts]\nconect_ms = 5\nconnect_ms = \"x\"\n"
            .parse()
            .unwrap();
        let (config, problems) = read(table);
        assert!(config.is_some(), "the rest is read with defaults");
        assert_eq!(problems.len(), 4, "{problems:#?}");
        for key in [
            "listne:",
            "max_header_bytes:",
            "timeouts.conect_ms:",
            "timeouts.connect_ms:",
        ] {
            assert_eq!(
                problems.iter().filter(|p| p.starts_with(key)).count(),
                1,
                "{key} once in {problems:#?}"
            );
        }
    }

    #[test]
    fn a_bad_list_element_takes_its_list() {
        let table: toml::Table = "[users]\norder = [\"path\", \"nope\"]\n".parse().unwrap();
        let (config, problems) = read(table);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].starts_with("users.order"), "{problems:#?}");
        assert_eq!(
            config.unwrap().users.order,
            ServeConfig::default().users.order
        );
    }
}
