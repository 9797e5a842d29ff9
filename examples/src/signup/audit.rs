//! Which audit a reply answers.
//!
//! `main` audits the sagas by sending `Audit` messages and waiting for the replies. A run
//! killed during its audit leaves its `Audit` messages queued, and the next run handles
//! them beside its own: their replies must not count. So every audit has an id
//! ([`AuditId`]: the run that sent it and its number in that run), carried by its `Audit`
//! messages and by every reply; [`Audits`] takes in the replies to the audit being waited
//! for and counts the others, which the program then reports.
//!
//! Also here: the `Audit` message itself, `found` (a saga's answer: it has an instance)
//! and the plain handler `audit_done` (an endpoint's audit of a user is over).

use std::collections::HashSet;
use std::fmt;

use courier::prelude::*;
use serde::{Deserialize, Serialize};

use crate::story::{News, tell};

/// Which audit an `Audit` message or a reply belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct AuditId {
    /// The run that sent it (unique across runs: its start time and process id).
    run: String,
    /// The audit's number in that run, from 1.
    n: u32,
}

impl fmt::Display for AuditId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.run, self.n)
    }
}

/// This run's audits: the one being waited for, and the replies to others.
#[derive(Debug)]
pub(crate) struct Audits {
    run: String,
    /// Audits begun so far.
    begun: u32,
    /// Replies ignored: those to another run's audits (an earlier run's, whose `Audit`
    /// messages were still queued, or, on the Postgres transport, a run at the same time:
    /// every run hears every reply), and those to an earlier audit of this run (one that
    /// ended before all its replies were read).
    ignored_earlier_runs: u32,
    ignored_this_run: u32,
    /// The earlier runs' audits that were answered in this run.
    earlier: HashSet<AuditId>,
}

impl Audits {
    /// The audits of a run that started at `started_ms` (Unix milliseconds).
    pub(crate) fn new(started_ms: i64) -> Self {
        Self {
            run: format!("{started_ms:x}-{}", std::process::id()),
            begun: 0,
            ignored_earlier_runs: 0,
            ignored_this_run: 0,
            earlier: HashSet::new(),
        }
    }

    /// A new audit, which the replies must name from now on.
    pub(crate) fn begin(&mut self) -> AuditId {
        self.begun += 1;
        AuditId {
            run: self.run.clone(),
            n: self.begun,
        }
    }

    /// Whether a reply to `audit` answers the audit being waited for (the last one begun);
    /// counts it when it does not.
    pub(crate) fn answers_current(&mut self, audit: &AuditId) -> bool {
        if audit.run == self.run && audit.n == self.begun {
            return true;
        }
        if audit.run == self.run {
            self.ignored_this_run += 1;
        } else {
            self.ignored_earlier_runs += 1;
            self.earlier.insert(audit.clone());
        }
        false
    }

    /// How many replies were ignored.
    pub(crate) fn ignored(&self) -> u32 {
        self.ignored_earlier_runs + self.ignored_this_run
    }

    /// What was ignored, in words; `None` if nothing was.
    pub(crate) fn report(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.ignored_earlier_runs > 0 {
            let audits = self.earlier.len();
            parts.push(format!(
                "{} to {audits} audit{} of another run (an earlier run's Audit messages still queued \
                 when it was stopped, or a run at the same time)",
                self.ignored_earlier_runs,
                if audits == 1 { "" } else { "s" },
            ));
        }
        if self.ignored_this_run > 0 {
            parts.push(format!("{} to an earlier audit of this run", self.ignored_this_run));
        }
        if parts.is_empty() {
            return None;
        }
        Some(format!(
            "ignored {} repl{} to other audits: {}",
            self.ignored(),
            if self.ignored() == 1 { "y" } else { "ies" },
            parts.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_audit_counts() {
        let mut earlier_run = Audits::new(1);
        let old = earlier_run.begin();
        let mut audits = Audits::new(2);
        let first = audits.begin();
        assert!(audits.answers_current(&first));
        assert!(!audits.answers_current(&old));
        let second = audits.begin();
        assert!(audits.answers_current(&second));
        assert!(!audits.answers_current(&first));
        assert!(!audits.answers_current(&old));
        assert_eq!(audits.ignored(), 3);
        let report = audits.report().unwrap();
        assert!(report.starts_with("ignored 3 replies to other audits: 2 to 1 audit of another run"));
        assert!(report.ends_with("; 1 to an earlier audit of this run"), "{report}");
        assert_eq!(Audits::new(3).report(), None);
    }
}

/// Asks the sagas of a user to tell `main` their state (sent by `main` to `accounts` and
/// to `users`). Each saga that has an instance answers; the plain handler
/// [`audit_done`], added after the sagas, then says the audit of that endpoint is over,
/// so an instance that stayed silent does not exist. Every reply names the audit: `main`
/// ignores the replies to another one (a killed run's `Audit` messages stay queued).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "signup.Audit")]
pub(crate) struct Audit {
    /// Which audit this is (none in the messages of versions before audits had ids).
    #[serde(default)]
    pub(crate) audit: AuditId,
    /// The user (`SignUp` and `Persona` instances).
    pub(crate) user_id: String,
    /// The user's login (`Login` instance).
    pub(crate) login_id: String,
}

/// Ends an endpoint's audit of a user: runs after the sagas' own `audit` handlers.
#[courier::handler]
pub(crate) async fn audit_done(q: Audit, ctx: &mut Context) -> Result<(), HandlerError> {
    tell(
        ctx,
        News::AuditDone {
            audit: q.audit,
            endpoint: ctx.endpoint().to_owned(),
            user_id: q.user_id,
        },
    )
}

/// A saga's answer to an audit: it has an instance for the user, in `phase`.
pub(crate) fn found(ctx: &mut Context, q: Audit, saga: &'static str, phase: &'static str) -> Result<(), HandlerError> {
    tell(
        ctx,
        News::Found {
            audit: q.audit,
            user_id: q.user_id,
            saga: saga.to_owned(),
            phase: phase.to_owned(),
        },
    )
}
