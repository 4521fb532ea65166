//! Admission: what is recorded of a request once it is on its way upstream (or refused), where
//! nothing sent depends on it: what its body says and the session's clues in its head, then the
//! observers told it started.

use std::sync::Arc;

use bytes::Bytes;

use crate::proxy::request::RequestInfo;
use crate::proxy::tracker::{SessionClues, Tracker};

/// Admits the request (the observers hear of it), after recording what its body says (read now
/// when nothing sent depended on it) and the session's clues in its head, and identifying it
/// (`identify`, which considers the body's `user`).
pub(super) fn admit(
    tracker: &mut Tracker,
    unnoted: &mut Unnoted,
    body: &Bytes,
    headers: &http::HeaderMap,
    metered: bool,
    identify: impl FnOnce(&mut Tracker),
) {
    let info = match std::mem::replace(unnoted, Unnoted::Nothing) {
        Unnoted::Nothing => None,
        Unnoted::Parsed(info) => Some(info),
        Unnoted::Unread => Some(RequestInfo::parse(body)),
    };
    if let Some(info) = info {
        // The head's clues; the body's are added to them.
        let clues = SessionClues {
            header: metered
                .then(|| crate::proxy::session::from_headers(headers))
                .flatten(),
            body: None,
            conversation: None,
            turn_key: metered
                .then(|| crate::proxy::session::codex_turn(headers))
                .flatten(),
        };
        note_body(tracker, &info, body, metered, clues);
    }
    identify(tracker);
    tracker.admit();
}

/// A generation request's body fields, until `admit` records them.
pub(super) enum Unnoted {
    /// Not a generation request, or recorded.
    Nothing,
    /// Read before the upstream write, because what was sent depended on them.
    Parsed(RequestInfo),
    /// Not read yet: nothing sent depended on them.
    Unread,
}

/// Records what the request body says: model, stream, n, the body's user and, metered, the
/// session's clues (`clues`, the head's, completed with the body's).
fn note_body(
    tracker: &mut Tracker,
    info: &RequestInfo,
    body: &Bytes,
    metered: bool,
    clues: SessionClues,
) {
    let meta = tracker.meta_mut();
    meta.model = info.model.as_deref().map(Arc::from);
    meta.stream = info.stream;
    meta.n = info.n;
    if let Some(user) = &info.user {
        tracker.set_body_user(user.clone());
    }
    if metered {
        tracker.set_session_clues(SessionClues {
            body: info.session.clone(),
            conversation: info.conversation.clone().map(|r| body.slice(r)),
            ..clues
        });
    }
}
