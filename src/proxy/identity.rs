//! Who sent a request, from the configured sources in order; raw keys never leave this module.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use crate::config::UsersConfig;
use crate::hex::hex;
use crate::record::UserSource;

/// The longest user name kept; longer names are cut.
const MAX_USER_LEN: usize = 64;

/// A request's path with any `/u/<name>` prefix split off.
#[derive(Debug, PartialEq, Eq)]
pub struct PathUser<'a> {
    /// The name from the prefix, when there was a valid one.
    pub user: Option<&'a str>,
    /// The path to forward (prefix removed).
    pub path: &'a str,
}

/// Splits `/u/<name>/rest` into `name` and `/rest`; other paths are returned whole.
pub fn split_user_prefix(path: &str) -> PathUser<'_> {
    if let Some(rest) = path.strip_prefix("/u/") {
        let (name, tail) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if !name.is_empty() && name.len() <= MAX_USER_LEN && name.bytes().all(is_name_byte) {
            return PathUser {
                user: Some(name),
                path: tail,
            };
        }
    }
    PathUser { user: None, path }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b'+')
}

/// Makes a client-supplied name safe to log: printable ASCII-ish, bounded length.
fn clean(name: &str) -> Option<String> {
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let cleaned: String = name
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_USER_LEN)
        .collect();
    (!cleaned.is_empty()).then_some(cleaned)
}

/// The header Anthropic clients send their key in.
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The API key of a request, if any: `Authorization: Bearer <key>`, else `x-api-key: <key>`
/// (Anthropic clients). Every use of a client key (key map, pseudonym, `require_known_key`)
/// reads it here.
pub fn bearer_key(headers: &HeaderMap) -> Option<&str> {
    authorization_key(headers).or_else(|| x_api_key(headers))
}

fn authorization_key(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|k| !k.is_empty())
}

/// The key in `x-api-key`, when present and not empty.
pub fn x_api_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(&X_API_KEY)?
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// The pseudonym of a key: `key-` and the first 8 hex digits of its SHA-256.
pub fn key_pseudonym(key: &str) -> String {
    pseudonym_of(&digest(key))
}

/// Keys (up to [`DIGEST_MEMO_KEY_BYTES`] long) whose digests a serving thread keeps.
const DIGEST_MEMO_KEYS: usize = 8;
/// The longest key whose digest is kept: a key is tens of bytes, and a client's header must not
/// make the proxy keep more than a few KiB.
const DIGEST_MEMO_KEY_BYTES: usize = 256;

/// The SHA-256 of `key`. An agent sends the same key with every request, and its digest was the
/// largest single part of the work after the upstream write, which on a small box delays the
/// upstream's own wake-up (docs/performance.md): each thread keeps the digests of the last few
/// keys it saw. A key is compared with each kept one in constant time, with no early exit.
fn digest(key: &str) -> [u8; 32] {
    type Kept = (usize, Vec<(Box<[u8]>, [u8; 32])>);
    thread_local! {
        static KEPT: std::cell::RefCell<Kept> = const { std::cell::RefCell::new((0, Vec::new())) };
    }
    let key = key.as_bytes();
    if key.len() > DIGEST_MEMO_KEY_BYTES {
        return Sha256::digest(key).into();
    }
    KEPT.with_borrow_mut(|(next, kept)| {
        let mut found = None;
        for (k, d) in kept.iter() {
            if constant_time_eq(k, key) && found.is_none() {
                found = Some(*d);
            }
        }
        if let Some(d) = found {
            return d;
        }
        let d: [u8; 32] = Sha256::digest(key).into();
        if kept.len() < DIGEST_MEMO_KEYS {
            kept.push((Box::from(key), d));
        } else {
            kept[*next] = (Box::from(key), d);
            *next = (*next + 1) % DIGEST_MEMO_KEYS;
        }
        d
    })
}

fn pseudonym_of(d: &[u8; 32]) -> String {
    let mut s = String::with_capacity(12);
    s.push_str("key-");
    s.push_str(hex(&d[..4]).as_str());
    s
}

/// The configured name of `key`, comparing in constant time per entry.
pub fn known_key_name<'c>(config: &'c UsersConfig, key: &str) -> Option<&'c str> {
    known_key_name_with(config, key, &mut None)
}

/// [`known_key_name`] with the key's digest computed at most once per request (`digest` keeps
/// it), and not at all when no keys are configured.
fn known_key_name_with<'c>(
    config: &'c UsersConfig,
    key: &str,
    digest_memo: &mut Option<[u8; 32]>,
) -> Option<&'c str> {
    if config.api_keys.is_empty() {
        return None;
    }
    let d = *digest_memo.get_or_insert_with(|| digest(key));
    let hex = hex(&d);
    let mut found = None;
    for (name, secret) in &config.api_keys {
        let expected = &secret.0;
        let matches = match expected.strip_prefix("sha256:") {
            Some(h) => constant_time_eq(h.to_ascii_lowercase().as_bytes(), hex.as_str().as_bytes()),
            None => constant_time_eq(expected.as_bytes(), key.as_bytes()),
        };
        if matches && found.is_none() {
            found = Some(name.as_str());
        }
    }
    found
}

/// Compares without an early exit, so timing does not reveal how much of a key matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Everything identification looks at.
pub struct Clues<'a> {
    /// Name from a `/u/<name>` prefix.
    pub path_user: Option<&'a str>,
    /// Request headers.
    pub headers: &'a HeaderMap,
    /// The body's `user` field.
    pub body_user: Option<&'a str>,
    /// The client's address.
    pub client_ip: IpAddr,
}

/// Picks the user by the configured order; the client IP always answers last.
pub fn identify(config: &UsersConfig, clues: &Clues<'_>) -> (String, UserSource) {
    let key = bearer_key(clues.headers);
    // The key map and the pseudonym share one SHA-256 of the key.
    let mut digest_memo = None;
    for source in &config.order {
        let name = match source {
            UserSource::Path => clues.path_user.and_then(clean),
            UserSource::Header => clues
                .headers
                .get(config.header.as_str())
                .and_then(|v| v.to_str().ok())
                .and_then(clean),
            UserSource::KeyMap => key
                .and_then(|k| known_key_name_with(config, k, &mut digest_memo))
                .map(str::to_string),
            UserSource::Body => clues.body_user.and_then(clean),
            UserSource::KeyHash => {
                key.map(|k| pseudonym_of(digest_memo.get_or_insert_with(|| digest(k))))
            }
            UserSource::Ip => Some(clues.client_ip.to_string()),
        };
        if let Some(name) = name {
            return (name, *source);
        }
    }
    (clues.client_ip.to_string(), UserSource::Ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn path_prefix_is_split() {
        assert_eq!(
            split_user_prefix("/u/alice/v1/models"),
            PathUser {
                user: Some("alice"),
                path: "/v1/models"
            }
        );
        assert_eq!(
            split_user_prefix("/u/a b/v1"),
            PathUser {
                user: None,
                path: "/u/a b/v1"
            }
        );
        assert_eq!(
            split_user_prefix("/v1/models"),
            PathUser {
                user: None,
                path: "/v1/models"
            }
        );
    }

    #[test]
    fn order_decides_and_ip_is_the_fallback() {
        let mut cfg = UsersConfig::default();
        cfg.api_keys.insert("bob".into(), Secret("sk-bob".into()));
        let h = headers(&[
            ("x-tokenmeter-user", "carol"),
            ("authorization", "Bearer sk-bob"),
        ]);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let clues = Clues {
            path_user: Some("alice"),
            headers: &h,
            body_user: Some("dave"),
            client_ip: ip,
        };
        assert_eq!(identify(&cfg, &clues), ("alice".into(), UserSource::Path));
        let clues = Clues {
            path_user: None,
            ..clues
        };
        assert_eq!(identify(&cfg, &clues), ("carol".into(), UserSource::Header));
        let h2 = headers(&[("authorization", "Bearer sk-bob")]);
        let clues = Clues {
            path_user: None,
            headers: &h2,
            body_user: Some("dave"),
            client_ip: ip,
        };
        assert_eq!(identify(&cfg, &clues), ("bob".into(), UserSource::KeyMap));
        let h3 = headers(&[("authorization", "Bearer sk-other")]);
        let clues = Clues {
            path_user: None,
            headers: &h3,
            body_user: Some("dave"),
            client_ip: ip,
        };
        assert_eq!(identify(&cfg, &clues), ("dave".into(), UserSource::Body));
        let clues = Clues {
            body_user: None,
            ..clues
        };
        let (name, src) = identify(&cfg, &clues);
        assert_eq!(src, UserSource::KeyHash);
        assert_eq!(name, key_pseudonym("sk-other"));
        assert!(name.starts_with("key-") && name.len() == 12 && !name.contains("sk-"));
        let empty = HeaderMap::new();
        let clues = Clues {
            path_user: None,
            headers: &empty,
            body_user: None,
            client_ip: ip,
        };
        assert_eq!(identify(&cfg, &clues), ("10.0.0.1".into(), UserSource::Ip));
    }

    #[test]
    fn x_api_key_is_a_key_like_bearer() {
        let mut cfg = UsersConfig::default();
        cfg.api_keys
            .insert("ann".into(), Secret("sk-ant-ann".into()));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let h = headers(&[("x-api-key", "sk-ant-ann")]);
        assert_eq!(bearer_key(&h), Some("sk-ant-ann"));
        let clues = Clues {
            path_user: None,
            headers: &h,
            body_user: None,
            client_ip: ip,
        };
        assert_eq!(identify(&cfg, &clues), ("ann".into(), UserSource::KeyMap));
        let other = headers(&[("x-api-key", "sk-ant-other")]);
        let clues = Clues {
            headers: &other,
            ..clues
        };
        assert_eq!(
            identify(&cfg, &clues),
            (key_pseudonym("sk-ant-other"), UserSource::KeyHash)
        );
        // Both present: the bearer key answers, as before.
        let both = headers(&[("authorization", "Bearer sk-b"), ("x-api-key", "sk-x")]);
        assert_eq!(bearer_key(&both), Some("sk-b"));
        assert_eq!(bearer_key(&headers(&[("x-api-key", " ")])), None);
    }

    #[test]
    fn kept_digests_are_the_keys_own() {
        // More keys than are kept, each asked three times, one of them past the kept length.
        let long = "k".repeat(DIGEST_MEMO_KEY_BYTES + 1);
        let keys: Vec<String> = (0..DIGEST_MEMO_KEYS * 2 + 3)
            .map(|i| format!("sk-{i}"))
            .chain([long])
            .collect();
        for _ in 0..3 {
            for k in &keys {
                let want: [u8; 32] = Sha256::digest(k.as_bytes()).into();
                assert_eq!(digest(k), want, "{k}");
            }
            for k in keys.iter().rev().take(3) {
                let want: [u8; 32] = Sha256::digest(k.as_bytes()).into();
                assert_eq!(digest(k), want, "{k}");
            }
        }
    }

    #[test]
    fn pseudonym_agrees_with_format() {
        let d = Sha256::digest(b"sk-abc");
        let want = format!("key-{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3]);
        assert_eq!(key_pseudonym("sk-abc"), want);
    }

    #[test]
    fn hashed_keys_match() {
        let mut cfg = UsersConfig::default();
        let hex: String = Sha256::digest(b"sk-x")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        cfg.api_keys
            .insert("x".into(), Secret(format!("sha256:{hex}")));
        assert_eq!(known_key_name(&cfg, "sk-x"), Some("x"));
        assert_eq!(known_key_name(&cfg, "sk-y"), None);
    }
}
