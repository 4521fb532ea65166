//! The user settings requests read, replaceable while serving (a SIGHUP reload swaps them; each
//! request takes one snapshot, so a reload mid-request does not change its rules).

use std::sync::{Arc, RwLock};

use crate::config::UsersConfig;

/// The user settings requests read, replaceable while serving.
#[derive(Debug)]
pub struct LiveUsers(RwLock<Arc<UsersConfig>>);

impl LiveUsers {
    /// Starts with `users`.
    pub fn new(users: UsersConfig) -> LiveUsers {
        LiveUsers(RwLock::new(Arc::new(users)))
    }

    /// The current settings (one reference-count increment per request).
    pub fn get(&self) -> Arc<UsersConfig> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the settings; requests already started keep theirs.
    pub(crate) fn set(&self, users: UsersConfig) {
        let users = Arc::new(users);
        match self.0.write() {
            Ok(mut g) => *g = users,
            Err(poisoned) => *poisoned.into_inner() = users,
        }
    }
}
