//! The login sessions of a console that has an access token: each login gets a session
//! of its own, kept in memory on the server.
//!
//! A session is a random id (the cookie's value, 244 bits from the operating system's
//! generator) and a CSRF token of its own (every form of its pages carries it, and a POST
//! is refused unless its `csrf` field is this session's token). It ends:
//!
//! - on logout (`POST /logout` removes it: the old cookie is refused afterwards);
//! - [`IDLE`] after its last request, and [`MAX_AGE`] after its login in any case,
//!   measured on the console's clock ([`Console::clock`](super::Console::clock); a test
//!   drives a `VirtualClock`);
//! - when the console stops (the table is in memory: a restart logs everyone out);
//! - when the table is full ([`MAX_SESSIONS`]) and a login needs room: first the expired
//!   sessions go, then the one unused for the longest time.
//!
//! Only a login with the right access token makes a session, and the table never holds
//! more than [`MAX_SESSIONS`], so no request can make it grow without bound. The login
//! form itself is protected without a session (`security.rs`): a random value in a cookie
//! that the form's hidden field repeats, and the origin check of every POST.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Duration, Utc};
use courier::Clock;

use super::security::random_token;

/// A session ends this long after its last request.
pub const IDLE: Duration = Duration::hours(2);

/// A session ends this long after its login, however busy.
pub const MAX_AGE: Duration = Duration::hours(12);

/// The most sessions kept at once (a login beyond it ends the least recently used).
pub const MAX_SESSIONS: usize = 1024;

/// One login.
#[derive(Debug, Clone)]
struct Session {
    csrf: String,
    created: DateTime<Utc>,
    seen: DateTime<Utc>,
}

impl Session {
    fn expired(&self, now: DateTime<Utc>) -> bool {
        now - self.seen >= IDLE || now - self.created >= MAX_AGE
    }
}

/// The sessions of a console.
#[derive(Debug)]
pub(crate) struct Sessions {
    clock: Arc<dyn Clock>,
    capacity: usize,
    table: Mutex<HashMap<String, Session>>,
}

/// A session just opened: the cookie's value and its CSRF token.
#[derive(Debug, Clone)]
pub(crate) struct Opened {
    pub(crate) id: String,
    pub(crate) csrf: String,
}

impl Sessions {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_capacity(clock, MAX_SESSIONS)
    }

    pub(crate) fn with_capacity(clock: Arc<dyn Clock>, capacity: usize) -> Self {
        Self {
            clock,
            capacity: capacity.max(1),
            table: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Session>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session (after a login with the right token), making room if the table is
    /// full.
    pub(crate) fn open(&self) -> Opened {
        let now = self.clock.now();
        let opened = Opened {
            id: random_token(),
            csrf: random_token(),
        };
        let mut table = self.table();
        if table.len() >= self.capacity {
            table.retain(|_, s| !s.expired(now));
        }
        while table.len() >= self.capacity {
            let Some(oldest) = table.iter().min_by_key(|(_, s)| s.seen).map(|(id, _)| id.clone()) else {
                break;
            };
            table.remove(&oldest);
        }
        table.insert(
            opened.id.clone(),
            Session {
                csrf: opened.csrf.clone(),
                created: now,
                seen: now,
            },
        );
        opened
    }

    /// The CSRF token of the session `id` if it is open and not expired (its last use is
    /// now, then); `None` otherwise (an expired one is removed).
    pub(crate) fn admit(&self, id: &str) -> Option<String> {
        let now = self.clock.now();
        let mut table = self.table();
        let session = table.get_mut(id)?;
        if session.expired(now) {
            table.remove(id);
            return None;
        }
        session.seen = session.seen.max(now);
        Some(session.csrf.clone())
    }

    /// Ends the session `id` (logout); whether it was open.
    pub(crate) fn end(&self, id: &str) -> bool {
        self.table().remove(id).is_some()
    }

    /// How many sessions are kept (expired ones not yet removed included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier::VirtualClock;
    use proptest::prelude::*;

    fn clock() -> VirtualClock {
        VirtualClock::new(DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap_or_default())
    }

    #[test]
    fn each_login_has_its_own_id_and_csrf_token() {
        let sessions = Sessions::new(Arc::new(clock()));
        let a = sessions.open();
        let b = sessions.open();
        assert_ne!(a.id, b.id);
        assert_ne!(a.csrf, b.csrf);
        assert_ne!(a.id, a.csrf);
        assert_eq!(sessions.admit(&a.id).as_deref(), Some(a.csrf.as_str()));
        assert_eq!(sessions.admit(&b.id).as_deref(), Some(b.csrf.as_str()));
        assert!(sessions.end(&a.id));
        assert_eq!(sessions.admit(&a.id), None, "logged out");
        assert!(sessions.admit(&b.id).is_some(), "the other session stays");
    }

    #[test]
    fn a_session_ends_when_idle_or_old_on_the_consoles_clock() {
        let clock = clock();
        let sessions = Sessions::new(Arc::new(clock.clone()));
        let idle = sessions.open();
        let busy = sessions.open();
        for _ in 0..11 {
            clock.advance(std::time::Duration::from_secs(3600));
            assert!(sessions.admit(&busy.id).is_some(), "used every hour");
        }
        assert_eq!(sessions.admit(&idle.id), None, "idle for 11 h");
        clock.advance(std::time::Duration::from_secs(3599));
        assert!(sessions.admit(&busy.id).is_some(), "11 h 59 m 59 s after login");
        clock.advance(std::time::Duration::from_secs(1));
        assert_eq!(sessions.admit(&busy.id), None, "12 h after login");
        assert_eq!(sessions.len(), 0, "expired sessions are removed");
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_least_recently_used() {
        let clock = clock();
        let sessions = Sessions::with_capacity(Arc::new(clock.clone()), 3);
        let first = sessions.open();
        clock.advance(std::time::Duration::from_secs(1));
        let second = sessions.open();
        clock.advance(std::time::Duration::from_secs(1));
        let third = sessions.open();
        clock.advance(std::time::Duration::from_secs(1));
        assert!(
            sessions.admit(&first.id).is_some(),
            "first used again: second is the oldest now"
        );
        let fourth = sessions.open();
        assert_eq!(sessions.len(), 3);
        assert_eq!(sessions.admit(&second.id), None, "evicted");
        for s in [&first, &third, &fourth] {
            assert!(sessions.admit(&s.id).is_some());
        }
        for _ in 0..10_000 {
            sessions.open();
        }
        assert_eq!(sessions.len(), 3, "never more than the capacity");
    }

    proptest! {
        /// No cookie value an attacker may send is a session, whatever sessions are open.
        #[test]
        fn no_guessed_cookie_is_a_session(guess in ".{0,80}", logins in 0usize..4) {
            let sessions = Sessions::new(Arc::new(clock()));
            let open: Vec<Opened> = (0..logins).map(|_| sessions.open()).collect();
            prop_assume!(open.iter().all(|o| o.id != guess));
            prop_assert_eq!(sessions.admit(&guess), None);
            for o in &open {
                prop_assert!(sessions.admit(&o.id).is_some());
            }
        }
    }
}
