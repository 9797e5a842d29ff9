//! What the handlers tell `main`, and time: `Timing` turns the story's durations into
//! wall time (the time factor), `News` and `Event` are what the handlers report through
//! the `Newsroom` (endpoint state), and `story`/`tell` send it.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use courier::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::audit::AuditId;
use crate::fmt;
use crate::users::{Mail, PersonaView, Step};
use crate::workflow::Refusal;

// ---------------------------------------------------------------------------------------
// Time.
// ---------------------------------------------------------------------------------------

/// How much faster than real time the story runs; endpoint state of every endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Timing {
    /// 1000: one hour of the story lasts 3.6 s.
    pub(crate) scale: u32,
}

impl Timing {
    /// The endpoint's timing.
    pub(crate) fn of(ctx: &Context) -> Result<Self, HandlerError> {
        ctx.state::<Self>().copied()
    }

    /// The wall-clock duration of `story` time.
    pub(crate) fn wall(self, story: Duration) -> Duration {
        story / self.scale.max(1)
    }

    /// The wall-clock duration of `minutes` of the story.
    pub(crate) fn minutes(self, minutes: u64) -> Duration {
        self.wall(Duration::from_secs(minutes.saturating_mul(60)))
    }

    /// `minutes` of the story after `t`.
    pub(crate) fn after(self, t: DateTime<Utc>, minutes: u64) -> DateTime<Utc> {
        t + TimeDelta::from_std(self.minutes(minutes)).unwrap_or(TimeDelta::MAX)
    }

    /// The story time of a wall-clock duration.
    pub(crate) fn story(self, wall: TimeDelta) -> Duration {
        wall.to_std().unwrap_or_default().saturating_mul(self.scale)
    }
}

/// `01:02:03`.
pub(crate) fn clock_text(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `1 h 02 min`, `8 min`, `40 s` (to the nearest minute from a minute on).
pub(crate) fn length_text(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        return format!("{s} s");
    }
    let m = (s + 30) / 60;
    if m < 60 {
        format!("{m} min")
    } else {
        format!("{} h {:02} min", m / 60, m % 60)
    }
}

// ---------------------------------------------------------------------------------------
// What the handlers tell `main`.
// ---------------------------------------------------------------------------------------

/// News from the handlers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum News {
    /// Something happened to a user.
    Story {
        /// When (the handler's clock).
        at: DateTime<Utc>,
        /// The message being handled: a handling that is retried tells its story again
        /// under the same id, which `main` then ignores.
        message_id: String,
        /// The user.
        user_id: String,
        /// What happened.
        event: Event,
    },
    /// A Persona's state (after each change).
    Persona(PersonaView),
    /// A Persona's state, in reply to an audit.
    PersonaAudited {
        /// The audit answered.
        audit: AuditId,
        /// The state.
        view: PersonaView,
    },
    /// An audited saga instance exists.
    Found {
        /// The audit answered.
        audit: AuditId,
        /// The user.
        user_id: String,
        /// `SignUp` or `Login`.
        saga: String,
        /// Its state in words.
        phase: String,
    },
    /// An endpoint finished an audit.
    AuditDone {
        /// The audit answered.
        audit: AuditId,
        /// `accounts` or `users`.
        endpoint: String,
        /// The user.
        user_id: String,
    },
}

/// Something that happened to a user.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Event {
    /// The user sent the sign-up form.
    SignsUp { email: String },
    /// `SignUp` started.
    SignUpStarted,
    /// `mailer` sent a mail.
    MailSent { email: String, mail: Mail },
    /// What the user is going to do (their script).
    Intends(String),
    /// `SignUp` activated the account.
    Activated,
    /// `SignUp` removed the account.
    Removed,
    /// `Login` started and issued a code.
    CodeIssued { login_id: String },
    /// `Login`'s timeout fired.
    CodeExpired,
    /// `Login` accepted the code, typed `after` the code was issued (wall time).
    LoggedIn {
        #[serde(with = "millis")]
        after: TimeDelta,
    },
    /// `Login` refused the code.
    Refused {
        reason: Refusal,
        #[serde(with = "millis")]
        after: TimeDelta,
    },
}

impl Event {
    /// The checked step this is, if any.
    pub(crate) fn step(&self) -> Option<Step> {
        match self {
            Event::MailSent {
                mail: Mail::Confirmation,
                ..
            } => Some(Step::ConfirmationMail),
            Event::MailSent {
                mail: Mail::LoginCode { .. },
                ..
            } => Some(Step::CodeMail),
            Event::Activated => Some(Step::Activated),
            Event::Removed => Some(Step::Removed),
            Event::LoggedIn { .. } => Some(Step::LoggedIn),
            Event::Refused { reason, .. } => Some(Step::Refused(*reason)),
            Event::SignsUp { .. }
            | Event::SignUpStarted
            | Event::Intends(_)
            | Event::CodeIssued { .. }
            | Event::CodeExpired => None,
        }
    }

    /// The event in words.
    pub(crate) fn text(&self, timing: Timing) -> String {
        match self {
            Event::SignsUp { email } => format!("signs up as {email}"),
            Event::SignUpStarted => "accounts: SignUp saga started, confirmation mail requested, \
                                     1-hour expiry timeout set"
                .to_owned(),
            Event::MailSent {
                email,
                mail: Mail::Confirmation,
            } => format!("mailer: confirmation mail sent to {email}"),
            Event::MailSent {
                email,
                mail: Mail::LoginCode { code, .. },
            } => format!("mailer: login code {code} sent to {email}"),
            Event::Intends(what) => what.clone(),
            Event::Activated => "confirmed -> activated (UserActivated); expiry timeout cancelled".to_owned(),
            Event::Removed => "never confirmed -> removed after 1 h (UserRemoved)".to_owned(),
            Event::CodeIssued { login_id } => {
                format!("logs in ({login_id}): Login saga started, code valid 5 min")
            }
            Event::CodeExpired => "accounts: the login's 5 min are up: login kept as expired".to_owned(),
            Event::LoggedIn { after } => format!(
                "entered the code after {} -> logged in (LoginSucceeded); expiry timeout cancelled",
                length_text(timing.story(*after))
            ),
            Event::Refused { reason, after } => format!(
                "entered the code after {} -> refused: {reason} (LoginRefused)",
                length_text(timing.story(*after))
            ),
        }
    }
}

/// A `TimeDelta` as whole milliseconds.
mod millis {
    use chrono::TimeDelta;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &TimeDelta, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(d.num_milliseconds())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TimeDelta, D::Error> {
        Ok(TimeDelta::milliseconds(i64::deserialize(d)?))
    }
}

/// The handlers' line back to `main`: endpoint state of every endpoint.
#[derive(Debug, Clone)]
pub(crate) enum Newsroom {
    /// To the `main` of this process (one process at a time: the embedded broker, and
    /// RabbitMQ).
    Local(mpsc::UnboundedSender<News>),
    /// Published as a [`NewsNote`] in the handler's transaction, to every run at once: on
    /// the Postgres transport several runs share the work, and each must hear what the
    /// others' handlers did (`main` receives the notes with [`hear`]).
    Broadcast,
}

/// News published to every run ([`Newsroom::Broadcast`]).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "signup.News")]
pub(crate) struct NewsNote {
    pub(crate) news: News,
}

/// Where [`hear`] hands the notes to: `main`'s channel (state of the run's own endpoint).
#[derive(Debug, Clone)]
pub(crate) struct Heard(pub(crate) mpsc::UnboundedSender<News>);

/// The handler of a run's own endpoint (`signup-watch-<run>`, subscribed to the news):
/// hands each note to `main`. No store: a note heard twice is told twice, and `Watch`
/// takes each piece of news in once (by message id and step, by Persona version, by
/// audit).
#[courier::handler]
pub(crate) async fn hear(note: NewsNote, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Heard>()?
        .0
        .send(note.news)
        .map_err(|_| HandlerError::msg("main stopped listening"))
}

/// Tells `main` (this process's, or every run's).
pub(crate) fn tell(ctx: &mut Context, news: News) -> Result<(), HandlerError> {
    match ctx.state::<Newsroom>()?.clone() {
        Newsroom::Local(to_main) => to_main
            .send(news)
            .map_err(|_| HandlerError::msg("main stopped listening")),
        Newsroom::Broadcast => {
            ctx.publish(&NewsNote { news })?;
            Ok(())
        }
    }
}

/// Tells `main` what happened to `user_id`.
pub(crate) fn story(ctx: &mut Context, user_id: &str, event: Event) -> Result<(), HandlerError> {
    tell(
        ctx,
        News::Story {
            at: ctx.clock().now(),
            message_id: ctx.message_id().to_owned(),
            user_id: user_id.to_owned(),
            event,
        },
    )
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::CodeExpired => "code expired",
            Refusal::WrongCode => "wrong code",
        })
    }
}
