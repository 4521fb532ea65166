//! The upstream settings of `ServeConfig`: the single `upstream` shorthand or the named
//! `upstreams`, their `/metrics` targets, and the checks of `upstreams`, `routing` and
//! `otlp_endpoint`.

use anyhow::{bail, Context};

use super::ServeConfig;
use crate::fleet::settings::ResolvedUpstream;

impl ServeConfig {
    /// The first problem with `upstreams`, `routing` or `otlp_endpoint`.
    pub(super) fn fleet_problem(&self) -> anyhow::Result<()> {
        let ups = self.resolved_upstreams()?;
        let mut names = std::collections::HashSet::new();
        for u in &ups {
            if u.name.is_empty()
                || u.name.len() > 64
                || !u
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            {
                bail!(
                    "upstreams: name `{}` must be 1 to 64 of A-Z a-z 0-9 - _ . :",
                    u.name
                );
            }
            if !names.insert(u.name.clone()) {
                bail!("upstreams: name `{}` appears twice", u.name);
            }
        }
        if ups.len() > 64 {
            bail!("upstreams: at most 64");
        }
        let r = &self.routing;
        if !(r.models_refresh_s == 0.0 || (0.1..=86_400.0).contains(&r.models_refresh_s)) {
            bail!("routing.models_refresh_s: must be 0 or between 0.1 and 86400");
        }
        if r.eject_base_ms == 0 || r.eject_max_ms < r.eject_base_ms {
            bail!("routing: eject_base_ms must be positive and at most eject_max_ms");
        }
        if let Some(e) = self.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
            let uri: http::Uri = e
                .parse()
                .with_context(|| format!("otlp_endpoint: `{e}` is not a URL"))?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                bail!("otlp_endpoint: `{e}` must be http://host:port[/base]");
            }
        }
        Ok(())
    }

    /// The upstream as `/stats` names it: the `upstream` URL, or the `upstreams` URLs joined by
    /// commas.
    pub fn upstream_label(&self) -> String {
        if self.upstreams.is_empty() {
            return self.upstream.clone();
        }
        let urls: Vec<&str> = self.upstreams.iter().map(|u| u.url.as_str()).collect();
        urls.join(",")
    }

    /// The upstreams: `upstreams` when given, else `upstream` named by its `host:port`.
    pub fn resolved_upstreams(&self) -> anyhow::Result<Vec<ResolvedUpstream>> {
        let list: Vec<(String, &str, Option<&str>)> = if self.upstreams.is_empty() {
            let uri = parse_upstream("upstream", &self.upstream)?;
            let name = uri
                .authority()
                .map_or("upstream", |a| a.as_str())
                .to_string();
            vec![(name, self.upstream.as_str(), None)]
        } else {
            self.upstreams
                .iter()
                .map(|u| (u.name.clone(), u.url.as_str(), u.metrics_url.as_deref()))
                .collect()
        };
        list.into_iter()
            .map(|(name, url, metrics)| {
                let key = format!("upstreams.{name}.url");
                let uri = parse_upstream(&key, url)?;
                let authority = uri.authority().context("upstream has no host")?.to_string();
                let scheme = uri.scheme_str().unwrap_or("http");
                let base = format!("{scheme}://{authority}{}", uri.path().trim_end_matches('/'));
                let metrics =
                    metrics_target(metrics.or(self.upstream_metrics_url.as_deref()), &authority)?;
                Ok(ResolvedUpstream {
                    name,
                    url: url.to_string(),
                    base,
                    authority,
                    metrics,
                })
            })
            .collect()
    }

    /// The `/metrics` URL of the first upstream to scrape for the cross-check; `None` when
    /// scraping is off.
    pub fn metrics_uri(&self) -> anyhow::Result<Option<http::Uri>> {
        let up = self.upstream_uri()?;
        let authority = up.authority().context("upstream has no host")?;
        metrics_target(self.upstream_metrics_url.as_deref(), authority.as_str())
    }

    /// The upstream base URI (scheme http or https, with an authority) of the single-upstream
    /// shorthand.
    pub fn upstream_uri(&self) -> anyhow::Result<http::Uri> {
        parse_upstream("upstream", &self.upstream)
    }
}

/// Parses an upstream base URL (scheme http or https, with an authority); `key` names the
/// setting.
fn parse_upstream(key: &str, raw: &str) -> anyhow::Result<http::Uri> {
    let uri: http::Uri = raw
        .parse()
        .with_context(|| format!("{key}: `{raw}` is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        // `host:port` alone parses as a scheme and a path: the likeliest slip, so say the fix.
        let hint = if raw.contains("://") {
            String::new()
        } else {
            format!(" (did you mean `http://{raw}`?)")
        };
        bail!("{key}: `{raw}` must be http://host:port or https://host:port{hint}");
    }
    Ok(uri)
}

/// A `/metrics` setting (`None`/`""` off, `"auto"`, or a URL) for the upstream at `authority`.
fn metrics_target(setting: Option<&str>, authority: &str) -> anyhow::Result<Option<http::Uri>> {
    let raw = match setting.map(str::trim) {
        None | Some("") => return Ok(None),
        Some(r) => r,
    };
    if raw == "auto" {
        let uri = format!("http://{authority}/metrics")
            .parse()
            .context("upstream_metrics_url")?;
        return Ok(Some(uri));
    }
    let uri: http::Uri = raw
        .parse()
        .with_context(|| format!("upstream_metrics_url: `{raw}` is not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        bail!("upstream_metrics_url: `{raw}` must be \"auto\" or http://host:port/path");
    }
    Ok(Some(uri))
}
