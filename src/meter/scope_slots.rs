//! Named scopes (users, models) kept in stable slots: an open request holds its scopes' slots, so
//! its token events reach them without hashing a name (two SipHash lookups per streamed event
//! before).

use std::collections::HashMap;
use std::sync::Arc;

use super::scope::Scope;

/// Where a named scope lives in its [`Scopes`]. A slot outlives its scope only as a stale handle:
/// the generation tells a reused slot apart, and a stale handle finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ScopeSlot {
    index: u32,
    generation: u32,
}

#[derive(Debug, Clone)]
struct Entry {
    name: Arc<str>,
    generation: u32,
    scope: Option<Scope>,
}

/// Scopes by name, each in a slot of its own until it is removed.
#[derive(Debug, Clone, Default)]
pub(super) struct Scopes {
    index: HashMap<Arc<str>, u32>,
    entries: Vec<Entry>,
    free: Vec<u32>,
}

impl Scopes {
    /// Number of scopes kept.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether a scope of this name is kept.
    pub fn contains_key(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The slot of the scope named `name`.
    pub fn find(&self, name: &str) -> Option<ScopeSlot> {
        let &index = self.index.get(name)?;
        let generation = self.entries.get(index as usize)?.generation;
        Some(ScopeSlot { index, generation })
    }

    /// Keeps `scope` under `name` (which must not be kept yet) and returns its slot.
    pub fn insert(&mut self, name: Arc<str>, scope: Scope) -> ScopeSlot {
        let slot = match self.free.pop() {
            Some(index) => {
                let e = &mut self.entries[index as usize];
                e.generation = e.generation.wrapping_add(1);
                e.name = name.clone();
                e.scope = Some(scope);
                ScopeSlot {
                    index,
                    generation: e.generation,
                }
            }
            None => {
                let index = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
                self.entries.push(Entry {
                    name: name.clone(),
                    generation: 0,
                    scope: Some(scope),
                });
                ScopeSlot {
                    index,
                    generation: 0,
                }
            }
        };
        self.index.insert(name, slot.index);
        slot
    }

    /// The scope in `slot`, unless it was removed since.
    #[inline]
    pub fn get_mut(&mut self, slot: ScopeSlot) -> Option<&mut Scope> {
        let e = self.entries.get_mut(slot.index as usize)?;
        if e.generation != slot.generation {
            return None;
        }
        e.scope.as_mut()
    }

    /// Removes every scope for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(&Scope) -> bool) {
        for (i, e) in self.entries.iter_mut().enumerate() {
            if e.scope.as_ref().is_some_and(|s| !keep(s)) {
                e.scope = None;
                self.index.remove(&e.name);
                self.free.push(i as u32);
            }
        }
    }

    /// Every kept scope with its name.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Arc<str>, &mut Scope)> {
        self.entries
            .iter_mut()
            .filter_map(|e| e.scope.as_mut().map(|s| (&e.name, s)))
    }

    /// Every kept scope.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Scope> {
        self.entries.iter_mut().filter_map(|e| e.scope.as_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_put_and_a_reused_slot_is_not_found_through_an_old_handle() {
        let mut s = Scopes::default();
        let a = s.insert(Arc::from("a"), Scope::new(0));
        let b = s.insert(Arc::from("b"), Scope::new(0));
        assert_eq!(s.find("a"), Some(a));
        assert_eq!(s.len(), 2);
        if let Some(sc) = s.get_mut(b) {
            sc.totals.requests = 7;
        }
        s.retain(|sc| sc.totals.requests == 7);
        assert!(!s.contains_key("a"));
        assert!(s.get_mut(a).is_none());
        let c = s.insert(Arc::from("c"), Scope::new(0));
        assert!(s.get_mut(a).is_none(), "a's old slot now holds c");
        assert!(s.get_mut(c).is_some());
        assert_eq!(s.get_mut(b).map(|sc| sc.totals.requests), Some(7));
        let mut names: Vec<String> = s.iter_mut().map(|(n, _)| n.to_string()).collect();
        names.sort();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(s.values_mut().count(), 2);
    }
}
