//! The sign-up workflow: two sagas with timeouts on a durable embedded broker, driven by
//! simulated users, that carries on where it stopped when the program is killed.
//!
//! - `accounts` runs two sagas. `SignUp` (one instance per user id) starts on
//!   `UserRegistered`, sends `SendConfirmationMail` to `mailer` and requests a 1-hour
//!   timeout. `EmailConfirmed` in time cancels the timeout, publishes `UserActivated` and
//!   completes; otherwise the timeout publishes `UserRemoved` and completes. `Login` (one
//!   instance per login id) starts on `LoginRequested`, issues a two-factor code
//!   (`SendLoginCode` to `mailer`) and requests a 5-minute timeout; the right code entered
//!   in time publishes `LoginSucceeded` and completes, a code entered too late publishes
//!   `LoginRefused` with the reason. Two sagas, not one: a sign-up ends when the account is
//!   activated, while an account logs in many times over its life, each login with its
//!   own code and expiry.
//! - `mailer` "sends" the mails: it prints them and delivers them to the user's mailbox.
//! - `users` plays the users. Each one is a saga too (`Persona`, by user id) following a
//!   script: ann confirms after 10 min, logs in and types her code after 1 min; bob and
//!   erin never confirm; carol confirms but types her code after 8 min, when it expired 3
//!   min before; dave confirms 5 min before his deadline and does not log in. A user's
//!   actions are scheduled messages (`SendOptions::deliver_at`) sent from the Persona's
//!   handlers, and the Persona remembers what happened to the user.
//!
//! Run it with `cargo run -p courier-examples --bin signup`. It needs no server and takes
//! about 4 s: time is scaled 1000 times (1 h of the story is 3.6 s; `--scale N` sets
//! another factor, `--real-time` uses real durations: 1 h 10 min). The sagas ask for the
//! real durations (1 h, 5 min) and divide them by the factor held in endpoint state
//! (`Timing`); the users' delays are scaled the same way. Courier has no scaled clock (a
//! `VirtualClock` stands still until a test moves it), and scaling the broker's clock too
//! would also shrink its lock durations. Each line shows the story's time (`sim`) and the
//! wall time since the scenario started (a handling takes a few milliseconds: a few seconds
//! of story time). The framework's own log is off by default; `RUST_LOG=courier=info`
//! shows it.
//!
//! The broker lives in the SQLite file `signup.db` (`--db PATH` for another) and the
//! sagas, inbox and timeouts in the same file (`broker.store()`: one SQLite transaction per
//! message). With `DATABASE_URL` set (or `--postgres URL`), the store is Postgres (schema
//! `courier`) and the broker stays embedded. With `AMQP_URL` set as well (or `--rabbitmq
//! URL`), the broker is RabbitMQ: queues and topics there, scheduled messages and sagas in
//! Postgres (RabbitMQ needs the Postgres store: it holds the scheduled messages). With
//! `--transport postgres` (or `COURIER_TRANSPORT=postgres`) and a Postgres URL, everything
//! lives in Postgres alone: queues, topics and scheduled messages in the Postgres transport,
//! sagas and inbox beside them, one Postgres transaction per message
//! (`PostgresTransport::store()`); a run killed with SIGKILL resumes as on the other
//! brokers (the killed run's message locks end when its connections go). Not yet: two
//! runs at once on one database (each run's audit hears only the replies its own process
//! handled, so a run whose audit another process answered waits in vain).
//! `--fresh` on RabbitMQ deletes the example's queues instead of the file.
//!
//! Kill it and run it again (without `--fresh`): the workflows continue where they were.
//! - The scenario (its id, start time, time factor and store) is a message parked in the
//!   queue `signup-scenario`, which nothing receives: a run that finds it resumes that
//!   scenario (its time factor wins over `--scale`); `--fresh` deletes the database first.
//! - Each simulated user is started by an `Arrive` message with a fixed message id
//!   (`<scenario>-<name>-arrive`), sent again on every run: the endpoint's inbox handles a
//!   message id once, so a resumed run never registers anyone twice. Every later step is a
//!   message sent by a handler in its store transaction, so it happens once too; state,
//!   timeouts and scheduled user actions are in the database, not in the process.
//! - Time goes on while the program is down: a timeout that came due meanwhile fires at
//!   the restart, a user action scheduled meanwhile is delivered then. When the program was
//!   down across both a user's action and the deadline it races (dave's click and his
//!   hour), nothing guarantees which of the two is handled first at the restart; in
//!   practice the action is (the broker activates overdue scheduled messages as it opens,
//!   before the endpoint's dispatcher sends the overdue timeouts; the timeout then finds
//!   itself cancelled and is discarded). A code is judged by its time in any case (below).
//! - The scenario id is part of every user id: a Postgres store outlives the broker file
//!   that `--fresh` deletes, and what is left in it of earlier scenarios (their pending
//!   timeouts fire into this run) concerns users this run does not watch.
//! - A resumed run first asks every Persona where its user stands, waits for the
//!   workflows still in flight, then checks everything as a full run does. Running it
//!   again after the scenario finished finds every user settled and checks the result
//!   again; `--fresh` starts a new scenario.
//! - Each audit (the `Audit` messages that ask the sagas for their state) has an id that
//!   every reply carries. A run killed during its audit leaves `Audit` messages queued;
//!   the next run handles them too, ignores their replies and counts them in its output
//!   (`signup/audit.rs`).
//! - A step of the start that waits longer than a second says what it waits for
//!   (`signup/startup.rs`).
//!
//! How a late code is refused: the `Login` saga judges a code by when it was typed
//! (`CodeEntered::entered_at`, stamped by the user's side) against the expiry it stored,
//! not by whether its timeout was handled yet: a timeout fires at its time or a little
//! later, and a code typed just after the deadline may arrive first. When the timeout
//! fires, the login is marked expired and KEPT (not completed), so that a code typed later
//! still finds it and gets a `LoginRefused { reason: CodeExpired }`; completed, the code
//! would go to the saga's not-found policy, which only logs it. (A real service would
//! complete expired logins later, with a second, longer timeout.)
//!
//! It exits 0 only when every user ended as the script says, checked three ways: what the
//! handlers reported in this run (the full sequence on a fresh run, its end on a resumed
//! one), the Persona sagas' state (outcome, mails received exactly once each) and the
//! `accounts` sagas' state, asked with an `Audit` message: no `SignUp` left, carol's
//! `Login` kept as expired, no other `Login` left.
//!
//! Why one file of about 1,800 lines for now: the workflow (messages, sagas, handlers), the
//! simulated users and the choice of transport and store live here, with the audit, the
//! start-up waits and the metrics server already in `signup/`. Splitting the rest into a
//! folder with the workflow in a file of its own (under 300 lines) is issue 19's point 4.

#![allow(clippy::print_stdout)]

#[path = "signup/audit.rs"]
mod audit;
#[path = "signup/metrics.rs"]
mod metrics;
#[path = "signup/startup.rs"]
mod startup;

use std::collections::HashSet;
use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use audit::{AuditId, Audits};
use chrono::{DateTime, TimeDelta, Utc};
use courier::prelude::*;
use courier::saga::SagaContext;
use courier::{AmqpTransport, EndpointStats, PostgresStore, PostgresTransport, RunningEndpoint, ShutdownReport, Store};
use serde::{Deserialize, Serialize};
use startup::{Startup, Warnings};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing_subscriber::prelude::*;

/// How long a new user has to confirm the e-mail address.
const CONFIRMATION_WINDOW: Duration = Duration::from_secs(3600);
/// How long a two-factor code is valid.
const CODE_VALIDITY: Duration = Duration::from_secs(5 * 60);
/// The default time factor: 1 h of the story lasts 3.6 s.
const DEFAULT_SCALE: u32 = 1000;
/// The story's length: the last user is removed at 1 h 08 min.
const SCENARIO_LENGTH: Duration = Duration::from_secs(75 * 60);
/// How long past the story's end (wall time) the program waits before it gives up.
const GRACE: Duration = Duration::from_secs(20);
/// How long an audit may take.
const AUDIT_WAIT: Duration = Duration::from_secs(10);
/// How long a shutdown waits for running handlers (they take milliseconds).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// The queue where the scenario is parked (nothing receives from it).
const SCENARIO_QUEUE: &str = "signup-scenario";
/// The broker's file when `--db` is not given.
const DEFAULT_DB: &str = "signup.db";

const USAGE: &str = "usage: signup [--fresh] [--db PATH] [--scale N | --real-time] [--postgres URL] [--metrics ADDR]
  --fresh          delete the database and start a new scenario (default: resume the one in it)
  --db PATH        the embedded broker's SQLite file (default signup.db)
  --scale N        run time N times faster (default 1000: 1 h of the story = 3.6 s)
  --real-time      real durations (same as --scale 1)
  --rabbitmq URL   run on RabbitMQ instead of the embedded broker (default: $AMQP_URL if set;
                   needs --postgres or $DATABASE_URL)
  --postgres URL   keep sagas, inbox and timeouts in Postgres (default: $DATABASE_URL if set,
                   else the broker's own file)
  --transport postgres
                   run on Postgres alone: queues in the Postgres transport, one transaction
                   per message (default: $COURIER_TRANSPORT if set; needs --postgres or
                   $DATABASE_URL)
  --metrics ADDR   serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9000), and
                   keep serving after the story until Ctrl-C";

// ---------------------------------------------------------------------------------------
// The cast: who does what, and what should come of it.
// ---------------------------------------------------------------------------------------

/// A simulated user's script and the steps that should follow from it, in order.
#[derive(Debug)]
struct Member {
    /// The user's name (their e-mail is `<name>@example.com`).
    name: &'static str,
    /// When they sign up, in minutes after the start.
    arrives: u64,
    /// Minutes after the confirmation mail until they click its link; `None`: never.
    confirms_after: Option<u64>,
    /// Minutes after their activation until they log in; `None`: they don't.
    logs_in_after: Option<u64>,
    /// Minutes after the code mail until they type the code.
    enters_code_after: Option<u64>,
    /// What should happen to them, in order.
    expect: &'static [Step],
}

/// A step of a user's story that the program checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    /// `mailer` sent the confirmation mail.
    ConfirmationMail,
    /// `SignUp` activated the account.
    Activated,
    /// `SignUp` removed the account (the hour ran out).
    Removed,
    /// `mailer` sent a two-factor code.
    CodeMail,
    /// `Login` accepted the code.
    LoggedIn,
    /// `Login` refused the code.
    Refused(Refusal),
}

const CAST: &[Member] = &[
    Member {
        name: "ann",
        arrives: 0,
        confirms_after: Some(10),
        logs_in_after: Some(5),
        enters_code_after: Some(1),
        expect: &[Step::ConfirmationMail, Step::Activated, Step::CodeMail, Step::LoggedIn],
    },
    Member {
        name: "bob",
        arrives: 2,
        confirms_after: None,
        logs_in_after: None,
        enters_code_after: None,
        expect: &[Step::ConfirmationMail, Step::Removed],
    },
    Member {
        name: "carol",
        arrives: 4,
        confirms_after: Some(25),
        logs_in_after: Some(3),
        enters_code_after: Some(8),
        expect: &[
            Step::ConfirmationMail,
            Step::Activated,
            Step::CodeMail,
            Step::Refused(Refusal::CodeExpired),
        ],
    },
    Member {
        name: "dave",
        arrives: 6,
        confirms_after: Some(55),
        logs_in_after: None,
        enters_code_after: None,
        expect: &[Step::ConfirmationMail, Step::Activated],
    },
    Member {
        name: "erin",
        arrives: 8,
        confirms_after: None,
        logs_in_after: None,
        enters_code_after: None,
        expect: &[Step::ConfirmationMail, Step::Removed],
    },
];

impl Member {
    /// The member called `name`.
    fn named(name: &str) -> Option<&'static Member> {
        CAST.iter().find(|m| m.name == name)
    }

    /// How their story should end.
    fn expected_outcome(&self) -> Outcome {
        self.expect
            .iter()
            .rev()
            .find_map(|s| match s {
                Step::Activated => Some(Outcome::Activated),
                Step::Removed => Some(Outcome::Removed),
                Step::LoggedIn => Some(Outcome::LoggedIn),
                Step::Refused(r) => Some(Outcome::Refused(*r)),
                Step::ConfirmationMail | Step::CodeMail => None,
            })
            .unwrap_or_default()
    }

    /// How many mails they should receive.
    fn expected_mails(&self) -> u32 {
        let mails = self
            .expect
            .iter()
            .filter(|s| matches!(s, Step::ConfirmationMail | Step::CodeMail))
            .count();
        u32::try_from(mails).unwrap_or(u32::MAX)
    }

    /// Whether a user of this script with `outcome` has nothing left to do.
    fn is_settled(&self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Pending => false,
            Outcome::Activated => self.logs_in_after.is_none(),
            Outcome::Removed | Outcome::LoggedIn | Outcome::Refused(_) => true,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Messages.
// ---------------------------------------------------------------------------------------

/// The routing table every endpoint shares.
fn routes() -> Routes {
    Routes::new()
        .send::<UserRegistered>("accounts")
        .send::<EmailConfirmed>("accounts")
        .send::<LoginRequested>("accounts")
        .send::<CodeEntered>("accounts")
        .send::<Audit>("accounts")
        .send::<SendConfirmationMail>("mailer")
        .send::<SendLoginCode>("mailer")
        .send::<Arrive>("users")
        .send::<MailDelivered>("users")
        .event::<UserActivated>()
        .event::<UserRemoved>()
        .event::<LoginSucceeded>()
        .event::<LoginRefused>()
}

/// A user filled in the sign-up form (a command to `accounts`).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.UserRegistered")]
struct UserRegistered {
    /// The user.
    user_id: String,
    /// Where to send the confirmation mail.
    email: String,
}

/// A user clicked the link of the confirmation mail.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.EmailConfirmed")]
struct EmailConfirmed {
    /// The user.
    user_id: String,
}

/// `SignUp`'s timeout: the hour is up.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.ConfirmationExpired")]
struct ConfirmationExpired;

/// Event: the account is active.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.UserActivated")]
struct UserActivated {
    /// The user.
    user_id: String,
}

/// Event: the account was removed, unconfirmed.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.UserRemoved")]
struct UserRemoved {
    /// The user.
    user_id: String,
}

/// A user asked to log in (after typing the password, which this example leaves out).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.LoginRequested")]
struct LoginRequested {
    /// This login attempt.
    login_id: String,
    /// The user.
    user_id: String,
    /// Where to send the code.
    email: String,
}

/// A user typed a two-factor code.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.CodeEntered")]
struct CodeEntered {
    /// The login attempt.
    login_id: String,
    /// What they typed.
    code: String,
    /// When they typed it (stamped by the user's side, as a web front end would).
    entered_at: DateTime<Utc>,
}

/// `Login`'s timeout: the code expired.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.CodeExpiry")]
struct CodeExpiry;

/// Event: a login succeeded.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.LoginSucceeded")]
struct LoginSucceeded {
    /// The login attempt.
    login_id: String,
    /// The user.
    user_id: String,
}

/// Event: a code was refused.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.LoginRefused")]
struct LoginRefused {
    /// The login attempt.
    login_id: String,
    /// The user.
    user_id: String,
    /// Why.
    reason: Refusal,
}

/// Why a code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Refusal {
    /// It was typed after its expiry.
    CodeExpired,
    /// It is not the code that was sent.
    WrongCode,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::CodeExpired => "code expired",
            Refusal::WrongCode => "wrong code",
        })
    }
}

/// A command to `mailer`: send the confirmation mail.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "mailer.SendConfirmationMail")]
struct SendConfirmationMail {
    /// The user.
    user_id: String,
    /// Their address.
    email: String,
}

/// A command to `mailer`: send a two-factor code.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "mailer.SendLoginCode")]
struct SendLoginCode {
    /// The user.
    user_id: String,
    /// Their address.
    email: String,
    /// The login attempt.
    login_id: String,
    /// The code.
    code: String,
}

/// A mail arrived in a (simulated) user's mailbox.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "users.MailDelivered")]
struct MailDelivered {
    /// The user.
    user_id: String,
    /// What the mail says.
    mail: Mail,
}

/// What a mail says.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Mail {
    /// "Click here to confirm your address."
    Confirmation,
    /// "Your code is ..."
    LoginCode {
        /// The login attempt.
        login_id: String,
        /// The code.
        code: String,
    },
}

/// A simulated user enters the story (sent by `main` with a fixed message id).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "users.Arrive")]
struct Arrive {
    /// The user.
    user_id: String,
    /// Their name in the cast.
    name: String,
}

/// Asks the sagas of a user to tell `main` their state (sent by `main` to `accounts` and
/// to `users`). Each saga that has an instance answers; the plain handler
/// [`audit_done`], added after the sagas, then says the audit of that endpoint is over,
/// so an instance that stayed silent does not exist. Every reply names the audit: `main`
/// ignores the replies to another one (a killed run's `Audit` messages stay queued).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "signup.Audit")]
struct Audit {
    /// Which audit this is (none in the messages of versions before audits had ids).
    #[serde(default)]
    audit: AuditId,
    /// The user (`SignUp` and `Persona` instances).
    user_id: String,
    /// The user's login (`Login` instance).
    login_id: String,
}

/// The scenario, parked in [`SCENARIO_QUEUE`] so that a later run finds it.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "signup.Scenario")]
struct Scenario {
    /// Makes the user ids of this scenario unique (a Postgres store outlives the broker
    /// file that `--fresh` deletes).
    id: String,
    /// When the first user arrived.
    started_at: DateTime<Utc>,
    /// The time factor.
    timing: Timing,
    /// Where the sagas live: `sqlite` (the broker's file) or `postgres`.
    store: String,
}

impl Scenario {
    fn user_id(&self, name: &str) -> String {
        format!("{name}-{}", self.id)
    }
}

/// The login id of a user's (only) login in this story.
fn login_id_of(user_id: &str) -> String {
    format!("{user_id}.login")
}

/// A six-digit code derived from the login id (FNV-1a), so that runs are reproducible.
fn two_factor_code(login_id: &str) -> String {
    let hash = login_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("{:06}", hash % 1_000_000)
}

// ---------------------------------------------------------------------------------------
// Time.
// ---------------------------------------------------------------------------------------

/// How much faster than real time the story runs; endpoint state of every endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Timing {
    /// 1000: one hour of the story lasts 3.6 s.
    scale: u32,
}

impl Timing {
    /// The endpoint's timing.
    fn of(ctx: &Context) -> Result<Self, HandlerError> {
        ctx.state::<Self>().copied()
    }

    /// The wall-clock duration of `story` time.
    fn wall(self, story: Duration) -> Duration {
        story / self.scale.max(1)
    }

    /// The wall-clock duration of `minutes` of the story.
    fn minutes(self, minutes: u64) -> Duration {
        self.wall(Duration::from_secs(minutes.saturating_mul(60)))
    }

    /// `minutes` of the story after `t`.
    fn after(self, t: DateTime<Utc>, minutes: u64) -> DateTime<Utc> {
        t + TimeDelta::from_std(self.minutes(minutes)).unwrap_or(TimeDelta::MAX)
    }

    /// The story time of a wall-clock duration.
    fn story(self, wall: TimeDelta) -> Duration {
        wall.to_std().unwrap_or_default().saturating_mul(self.scale)
    }
}

/// `01:02:03`.
fn clock_text(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `1 h 02 min`, `8 min`, `40 s` (to the nearest minute from a minute on).
fn length_text(d: Duration) -> String {
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
#[derive(Debug, Clone)]
enum News {
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
        saga: &'static str,
        /// Its state in words.
        phase: &'static str,
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
#[derive(Debug, Clone)]
enum Event {
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
    LoggedIn { after: TimeDelta },
    /// `Login` refused the code.
    Refused { reason: Refusal, after: TimeDelta },
}

impl Event {
    /// The checked step this is, if any.
    fn step(&self) -> Option<Step> {
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
    fn text(&self, timing: Timing) -> String {
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

/// The handlers' line back to `main`: endpoint state of every endpoint.
#[derive(Debug, Clone)]
struct Newsroom(mpsc::UnboundedSender<News>);

/// Tells `main`.
fn tell(ctx: &Context, news: News) -> Result<(), HandlerError> {
    ctx.state::<Newsroom>()?
        .0
        .send(news)
        .map_err(|_| HandlerError::msg("main stopped listening"))
}

/// Tells `main` what happened to `user_id`.
fn story(ctx: &Context, user_id: &str, event: Event) -> Result<(), HandlerError> {
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

// ---------------------------------------------------------------------------------------
// `accounts`: the SignUp and Login sagas.
// ---------------------------------------------------------------------------------------

/// A sign-up waiting for its confirmation.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SignUp {
    /// Where the confirmation mail went.
    email: String,
}

#[courier::saga(name = "accounts.SignUp")]
impl SignUp {
    #[start(by = user_id)]
    async fn registered(&mut self, msg: UserRegistered, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if !ctx.is_new() {
            return Ok(()); // the form was sent twice: one sign-up is running already
        }
        let timing = Timing::of(ctx)?;
        ctx.send(&SendConfirmationMail {
            user_id: msg.user_id.clone(),
            email: msg.email.clone(),
        })?;
        // Keyed by its type: requested again, it would replace this one, not add a second.
        ctx.request_timeout(timing.wall(CONFIRMATION_WINDOW), &ConfirmationExpired)?;
        self.email = msg.email;
        story(ctx, &msg.user_id, Event::SignUpStarted)
    }

    #[handle(by = user_id)]
    async fn confirmed(&mut self, msg: EmailConfirmed, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.publish(&UserActivated {
            user_id: msg.user_id.clone(),
        })?;
        ctx.complete(); // deletes the instance and cancels its timeout
        story(ctx, &msg.user_id, Event::Activated)
    }

    #[timeout]
    async fn expired(&mut self, _t: ConfirmationExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        let user_id = ctx.saga_id().to_owned();
        ctx.publish(&UserRemoved {
            user_id: user_id.clone(),
        })?;
        ctx.complete();
        story(ctx, &user_id, Event::Removed)
    }

    #[handle(by = user_id)]
    async fn audit(&mut self, q: Audit, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        tell(
            ctx,
            News::Found {
                audit: q.audit,
                user_id: q.user_id,
                saga: "SignUp",
                phase: "awaiting confirmation",
            },
        )
    }
}

/// A login waiting for its two-factor code.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Login {
    /// The user.
    user_id: String,
    /// The code sent.
    code: String,
    /// When it was sent.
    issued_at: DateTime<Utc>,
    /// Until when it is valid.
    expires_at: DateTime<Utc>,
    /// The code expired: every code is refused from now on.
    expired: bool,
}

#[courier::saga(name = "accounts.Login")]
impl Login {
    #[start(by = login_id)]
    async fn requested(&mut self, msg: LoginRequested, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if !ctx.is_new() {
            return Ok(());
        }
        let validity = Timing::of(ctx)?.wall(CODE_VALIDITY);
        self.user_id = msg.user_id;
        self.code = two_factor_code(&msg.login_id);
        self.issued_at = ctx.clock().now();
        self.expires_at = self.issued_at + TimeDelta::from_std(validity).unwrap_or(TimeDelta::MAX);
        ctx.request_timeout(validity, &CodeExpiry)?;
        ctx.send(&SendLoginCode {
            user_id: self.user_id.clone(),
            email: msg.email,
            login_id: msg.login_id.clone(),
            code: self.code.clone(),
        })?;
        story(ctx, &self.user_id, Event::CodeIssued { login_id: msg.login_id })
    }

    #[handle(by = login_id)]
    async fn entered(&mut self, msg: CodeEntered, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        // Judged by when the code was typed, whether or not the timeout fired already.
        let refusal = if self.expired || msg.entered_at > self.expires_at {
            Some(Refusal::CodeExpired)
        } else if msg.code != self.code {
            Some(Refusal::WrongCode) // the login stays open: the user may try again
        } else {
            None
        };
        let after = msg.entered_at - self.issued_at;
        if refusal == Some(Refusal::CodeExpired) {
            self.expired = true;
        }
        if refusal != Some(Refusal::WrongCode) {
            ctx.cancel_timeout::<CodeExpiry>(); // by its type: no handle kept in the state
        }
        match refusal {
            None => {
                ctx.publish(&LoginSucceeded {
                    login_id: msg.login_id,
                    user_id: self.user_id.clone(),
                })?;
                ctx.complete();
                story(ctx, &self.user_id, Event::LoggedIn { after })
            }
            Some(reason) => {
                ctx.publish(&LoginRefused {
                    login_id: msg.login_id,
                    user_id: self.user_id.clone(),
                    reason,
                })?;
                story(ctx, &self.user_id, Event::Refused { reason, after })
            }
        }
    }

    /// Marks the login expired and keeps it (see the header: a late code must still find it).
    #[timeout]
    async fn expired(&mut self, _t: CodeExpiry, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.expired = true;
        story(ctx, &self.user_id, Event::CodeExpired)
    }

    #[handle(by = login_id)]
    async fn audit(&mut self, q: Audit, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        let phase = if self.expired { "expired" } else { "awaiting the code" };
        tell(
            ctx,
            News::Found {
                audit: q.audit,
                user_id: q.user_id,
                saga: "Login",
                phase,
            },
        )
    }
}

/// Ends an endpoint's audit of a user: runs after the sagas' own `audit` handlers.
#[courier::handler]
async fn audit_done(q: Audit, ctx: &mut Context) -> Result<(), HandlerError> {
    tell(
        ctx,
        News::AuditDone {
            audit: q.audit,
            endpoint: ctx.endpoint().to_owned(),
            user_id: q.user_id,
        },
    )
}

// ---------------------------------------------------------------------------------------
// `mailer`.
// ---------------------------------------------------------------------------------------

#[courier::handler]
async fn send_confirmation_mail(cmd: SendConfirmationMail, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.send(&MailDelivered {
        user_id: cmd.user_id.clone(),
        mail: Mail::Confirmation,
    })?;
    let event = Event::MailSent {
        email: cmd.email,
        mail: Mail::Confirmation,
    };
    story(ctx, &cmd.user_id, event)
}

#[courier::handler]
async fn send_login_code(cmd: SendLoginCode, ctx: &mut Context) -> Result<(), HandlerError> {
    let mail = Mail::LoginCode {
        login_id: cmd.login_id,
        code: cmd.code,
    };
    ctx.send(&MailDelivered {
        user_id: cmd.user_id.clone(),
        mail: mail.clone(),
    })?;
    story(ctx, &cmd.user_id, Event::MailSent { email: cmd.email, mail })
}

// ---------------------------------------------------------------------------------------
// `users`: the simulated users.
// ---------------------------------------------------------------------------------------

/// Where a user's story stands, as their Persona sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
enum Outcome {
    /// Nothing final yet.
    #[default]
    Pending,
    /// The account is active.
    Activated,
    /// The account was removed.
    Removed,
    /// Logged in.
    LoggedIn,
    /// The code was refused.
    Refused(Refusal),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Pending => f.write_str("pending"),
            Outcome::Activated => f.write_str("activated"),
            Outcome::Removed => f.write_str("removed"),
            Outcome::LoggedIn => f.write_str("logged in"),
            Outcome::Refused(r) => write!(f, "refused: {r}"),
        }
    }
}

/// A Persona's state as `main` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PersonaView {
    /// The user.
    user_id: String,
    /// Where they stand.
    outcome: Outcome,
    /// Mails received.
    mails: u32,
    /// One more at each change.
    version: u32,
}

/// A simulated user: follows their script, remembers what happened to them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Persona {
    /// The user.
    user_id: String,
    /// Their name in the cast.
    name: String,
    /// Where they stand.
    outcome: Outcome,
    /// Mails received.
    mails: u32,
    /// One more at each change.
    version: u32,
}

impl Persona {
    fn script(&self) -> Option<&'static Member> {
        Member::named(&self.name)
    }

    fn email(&self) -> String {
        format!("{}@example.com", self.name)
    }

    fn view(&self) -> PersonaView {
        PersonaView {
            user_id: self.user_id.clone(),
            outcome: self.outcome,
            mails: self.mails,
            version: self.version,
        }
    }

    /// Records a change and tells `main`.
    fn changed(&mut self, ctx: &Context) -> Result<(), HandlerError> {
        self.version += 1;
        tell(ctx, News::Persona(self.view()))
    }

    fn intends(&self, ctx: &Context, what: String) -> Result<(), HandlerError> {
        story(ctx, &self.user_id, Event::Intends(what))
    }

    /// A finished story (the outcome is told to `main` by `changed`).
    fn ends(&mut self, outcome: Outcome, ctx: &Context) -> Result<(), HandlerError> {
        self.outcome = outcome;
        self.changed(ctx)
    }
}

#[courier::saga(name = "users.Persona")]
impl Persona {
    #[start(by = user_id)]
    async fn arrive(&mut self, msg: Arrive, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if !ctx.is_new() {
            return Ok(());
        }
        self.user_id = msg.user_id;
        self.name = msg.name;
        ctx.send(&UserRegistered {
            user_id: self.user_id.clone(),
            email: self.email(),
        })?;
        story(ctx, &self.user_id, Event::SignsUp { email: self.email() })?;
        self.changed(ctx)
    }

    #[handle(by = user_id)]
    async fn mail(&mut self, msg: MailDelivered, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.mails += 1;
        let timing = Timing::of(ctx)?;
        let now = ctx.clock().now();
        let script = self.script();
        match msg.mail {
            Mail::Confirmation => match script.and_then(|s| s.confirms_after) {
                Some(minutes) => {
                    let confirm = EmailConfirmed {
                        user_id: self.user_id.clone(),
                    };
                    ctx.send_with(&confirm, SendOptions::new().deliver_at(timing.after(now, minutes)))?;
                    self.intends(ctx, format!("opens the mail; will click its link in {minutes} min"))?;
                }
                None => self.intends(ctx, "ignores the mail".to_owned())?,
            },
            Mail::LoginCode { login_id, code } => match script.and_then(|s| s.enters_code_after) {
                Some(minutes) => {
                    let entered_at = timing.after(now, minutes);
                    let what = format!("gets code {code}; will type it in {minutes} min");
                    let entered = CodeEntered {
                        login_id,
                        code,
                        entered_at,
                    };
                    ctx.send_with(&entered, SendOptions::new().deliver_at(entered_at))?;
                    self.intends(ctx, what)?;
                }
                None => self.intends(ctx, "ignores the code".to_owned())?,
            },
        }
        self.changed(ctx)
    }

    #[handle(by = user_id)]
    async fn activated(&mut self, msg: UserActivated, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        match self.script().and_then(|s| s.logs_in_after) {
            Some(minutes) => {
                let at = Timing::of(ctx)?.after(ctx.clock().now(), minutes);
                let login = LoginRequested {
                    login_id: login_id_of(&msg.user_id),
                    user_id: msg.user_id,
                    email: self.email(),
                };
                ctx.send_with(&login, SendOptions::new().deliver_at(at))?;
                self.intends(ctx, format!("is active; will log in in {minutes} min"))?;
            }
            None => self.intends(ctx, "is active; does not log in today".to_owned())?,
        }
        self.ends(Outcome::Activated, ctx)
    }

    #[handle(by = user_id)]
    async fn removed(&mut self, _msg: UserRemoved, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.ends(Outcome::Removed, ctx)
    }

    #[handle(by = user_id)]
    async fn logged_in(&mut self, _msg: LoginSucceeded, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.ends(Outcome::LoggedIn, ctx)
    }

    #[handle(by = user_id)]
    async fn refused(&mut self, msg: LoginRefused, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.ends(Outcome::Refused(msg.reason), ctx)
    }

    #[handle(by = user_id)]
    async fn audit(&mut self, q: Audit, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        let view = self.view();
        tell(ctx, News::PersonaAudited { audit: q.audit, view })
    }
}

// ---------------------------------------------------------------------------------------
// `main`: set up, watch, check.
// ---------------------------------------------------------------------------------------

/// The command line.
#[derive(Debug)]
struct Options {
    db: PathBuf,
    fresh: bool,
    scale: Option<u32>,
    postgres: Option<String>,
    rabbitmq: Option<String>,
    /// `postgres`: the Postgres transport.
    transport: Option<String>,
    metrics: Option<std::net::SocketAddr>,
}

impl Options {
    /// Parses the arguments; `Ok(None)` for `--help`.
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut options = Options {
            db: PathBuf::from(DEFAULT_DB),
            fresh: false,
            scale: None,
            postgres: std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()),
            rabbitmq: std::env::var("AMQP_URL").ok().filter(|u| !u.is_empty()),
            transport: std::env::var("COURIER_TRANSPORT").ok().filter(|t| !t.is_empty()),
            metrics: None,
        };
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--fresh" => options.fresh = true,
                "--db" => options.db = PathBuf::from(value("--db")?),
                "--scale" => {
                    let n = value("--scale")?;
                    let scale = n.parse::<u32>().ok().filter(|s| *s >= 1);
                    options.scale = Some(scale.ok_or_else(|| format!("--scale takes a whole number >= 1, not {n}"))?);
                }
                "--real-time" => options.scale = Some(1),
                "--postgres" => options.postgres = Some(value("--postgres")?),
                "--rabbitmq" => options.rabbitmq = Some(value("--rabbitmq")?),
                "--transport" => options.transport = Some(value("--transport")?),
                "--metrics" => {
                    let addr = value("--metrics")?;
                    options.metrics = Some(addr.parse().map_err(|e| format!("--metrics {addr}: {e}"))?);
                }
                "-h" | "--help" => return Ok(None),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        match options.transport.as_deref() {
            None | Some("postgres") => {}
            Some(other) => return Err(format!("--transport takes postgres, not {other}")),
        }
        Ok(Some(options))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let warnings = Warnings::default(); // told when a step of the start waits long
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(filter))
        .with(warnings.clone().with_filter(tracing::level_filters::LevelFilter::WARN))
        .init();
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("signup: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(addr) = options.metrics
        && let Err(e) = metrics::serve(addr)
    {
        eprintln!("signup: cannot serve metrics on {addr}: {e}");
        return ExitCode::FAILURE;
    }
    match run(&options, &Startup::new(warnings), listen_for_ctrl_c()).await {
        Ok(()) if options.metrics.is_some() => {
            println!("serving the metrics until Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
            ExitCode::SUCCESS
        }
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Interrupted>() => {
            println!("signup: {e}");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("signup: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C (SIGINT) was pressed: the endpoints were shut down gracefully.
#[derive(Debug)]
struct Interrupted;

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("interrupted by Ctrl-C; the endpoints stopped gracefully (run it again to continue)")
    }
}

impl Error for Interrupted {}

/// Listens for Ctrl-C (SIGINT) from the start. Installing the handler matters: a program
/// started as a background job of a shell script inherits SIGINT *ignored*, and without
/// a handler of its own it would not stop at all.
fn listen_for_ctrl_c() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = tx.send(true);
        }
    });
    rx
}

/// Resolves once Ctrl-C was pressed (never, if the handler could not be installed).
async fn ctrl_c_pressed(ctrl_c: &mut tokio::sync::watch::Receiver<bool>) {
    if ctrl_c.wait_for(|pressed| *pressed).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The whole program; an error says what went wrong.
async fn run(
    options: &Options,
    start: &Startup,
    mut ctrl_c: tokio::sync::watch::Receiver<bool>,
) -> Result<(), Box<dyn Error>> {
    let (transport, store, store_kind, store_text, broker_text) = tokio::select! {
        opened = open(options, start) => opened?,
        () = ctrl_c_pressed(&mut ctrl_c) => return Err(Interrupted.into()),
    };
    let parked = start
        .step(startup::SCENARIO, find_scenario(&transport, options.fresh))
        .await?;
    if let Some(s) = &parked
        && s.store != store_kind
    {
        return Err(format!(
            "{} holds a scenario whose sagas live in {}, but this run uses {store_kind}: \
             run with the same store, or with --fresh",
            options.db.display(),
            s.store
        )
        .into());
    }
    let timing = match &parked {
        Some(s) => s.timing,
        None => Timing {
            scale: options.scale.unwrap_or(DEFAULT_SCALE),
        },
    };

    // The endpoints. `users` and `accounts` add the plain `audit_done` AFTER their sagas:
    // the handlers of one message type run in the order they were added.
    let (news_tx, mut news) = mpsc::unbounded_channel();
    let newsroom = Newsroom(news_tx);
    let endpoint = |name: &str| {
        Endpoint::builder(name)
            .transport(transport.clone())
            .store(store.clone())
            .routes(routes())
            .state(newsroom.clone())
            .state(timing)
            .shutdown_timeout(SHUTDOWN_TIMEOUT)
    };
    let endpoints = async {
        let users = endpoint("users").saga::<Persona>().handler(audit_done).start().await?;
        let mailer = endpoint("mailer")
            .handler(send_confirmation_mail)
            .handler(send_login_code)
            .start()
            .await?;
        let accounts = endpoint("accounts")
            .saga::<SignUp>()
            .saga::<Login>()
            .handler(audit_done)
            .start()
            .await?;
        Ok::<_, courier::Error>((users, mailer, accounts))
    };
    let (users, mailer, accounts) = start.step(startup::ENDPOINTS, endpoints).await?;

    // The story, until it ends or Ctrl-C: either way the endpoints shut down gracefully.
    let story = async {
        println!("sign-up example: broker {broker_text}");
        println!("  sagas, inbox and timeouts: {store_text}");
        if timing.scale == 1 {
            println!("  real time: the story lasts about 1 h 10 min");
        } else {
            println!(
                "  time runs {}x faster: 1 h of the story lasts {:.1} s (--real-time for real durations)",
                timing.scale,
                timing.wall(Duration::from_secs(3600)).as_secs_f64()
            );
        }
        let resumed = parked.is_some();
        let scenario = match parked {
            Some(s) => {
                let ago = Utc::now() - s.started_at;
                println!(
                    "resuming scenario {} (started {} ago, story time {}); --fresh starts a new one",
                    s.id,
                    length_text(ago.to_std().unwrap_or_default()),
                    clock_text(timing.story(ago))
                );
                if options.scale.is_some_and(|n| n != timing.scale) {
                    println!(
                        "  (its time factor {} is kept; --scale applies to new scenarios)",
                        timing.scale
                    );
                }
                s
            }
            None => {
                let now = Utc::now();
                let s = Scenario {
                    id: format!("{:08x}", now.timestamp_millis().rem_euclid(1 << 32)),
                    started_at: now,
                    timing,
                    store: store_kind.to_owned(),
                };
                let park = SendOptions::new().to(SCENARIO_QUEUE).message_id("scenario");
                users.bus().send_with(&s, park).await?;
                println!("new scenario {} with {} users", s.id, CAST.len());
                s
            }
        };

        // The users arrive: one message each, with a fixed id. On a resumed run they are sent
        // again and the inbox drops those handled before.
        for member in CAST {
            let arrive = Arrive {
                user_id: scenario.user_id(member.name),
                name: member.name.to_owned(),
            };
            let once = SendOptions::new()
                .message_id(format!("{}-{}-arrive", scenario.id, member.name))
                .deliver_at(timing.after(scenario.started_at, member.arrives));
            users.bus().send_with(&arrive, once).await?;
        }

        let mut watch = Watch::new(&scenario);
        if resumed {
            watch.audit(&[&users], &mut news).await?;
            println!("where the users stand:");
            for w in &watch.users {
                let outcome = w.persona.as_ref().map_or(Outcome::Pending, |p| p.outcome);
                println!("  {:<5}  {outcome}", w.member.name);
            }
        }
        println!();

        // Wait until every user's script has played out.
        let end = scenario.started_at + TimeDelta::from_std(timing.wall(SCENARIO_LENGTH)).unwrap_or(TimeDelta::MAX);
        let deadline = Instant::now() + (end - Utc::now()).to_std().unwrap_or_default() + GRACE;
        watch
            .until(&mut news, deadline, |w| w.all_settled())
            .await
            .map_err(|waited| format!("not every user's story ended in time: {waited}"))?;

        // Ask the sagas for their state, then stop.
        if watch.lines > 0 {
            println!();
        }
        watch.audit(&[&users, &accounts], &mut news).await?;
        Ok::<_, Box<dyn Error>>((watch, resumed))
    };
    let story = tokio::select! {
        played = story => Some(played),
        () = ctrl_c_pressed(&mut ctrl_c) => None,
    };
    let mut reports = Vec::new();
    for e in [accounts, mailer, users] {
        let stats = e.stats();
        let name = e.name().to_owned();
        reports.push((name, stats, e.shutdown().await?));
    }
    transport.close().await;
    let Some(played) = story else {
        for (name, stats, report) in &reports {
            print_stats(name, stats, report);
        }
        return Err(Interrupted.into());
    };
    let (mut watch, resumed) = played?;
    while let Ok(n) = news.try_recv() {
        watch.take(n);
    }

    for (name, stats, report) in &reports {
        print_stats(name, stats, report);
    }
    if let Some(ignored) = watch.audits.report() {
        println!("{ignored}");
    }
    watch.verdict(!resumed)
}

/// The broker and the store, as the options say.
async fn open(
    options: &Options,
    start: &Startup,
) -> Result<(Arc<dyn Transport>, Arc<dyn Store>, &'static str, String, String), Box<dyn Error>> {
    if options.transport.is_some() {
        let Some(pg) = &options.postgres else {
            return Err("--transport postgres needs a database: set DATABASE_URL or --postgres".into());
        };
        let postgres = PostgresTransport::builder(pg.clone()).migrate(false).open();
        let store = start.step(startup::POSTGRES, PostgresStore::connect(pg)).await?;
        start.step(startup::MIGRATIONS, store.migrate()).await?;
        let postgres = start.step(startup::POSTGRES, postgres).await?;
        let transport: Arc<dyn Transport> = Arc::new(postgres.clone());
        if options.fresh {
            delete_queues(&transport).await?;
        }
        let store_text = "Postgres (schema courier), one transaction per message with the queues".to_owned();
        return Ok((
            transport,
            Arc::new(postgres.store()),
            "postgres",
            store_text,
            "Postgres (the Postgres transport)".to_owned(),
        ));
    }
    if let Some(url) = &options.rabbitmq {
        let Some(pg) = &options.postgres else {
            return Err("RabbitMQ needs the Postgres store (it holds the scheduled messages): \
                        set DATABASE_URL or --postgres"
                .into());
        };
        let store = start.step(startup::POSTGRES, PostgresStore::connect(pg)).await?;
        start.step(startup::MIGRATIONS, store.migrate()).await?;
        let rabbit = AmqpTransport::builder(url.clone())
            .schedules(&store)
            .connection_name("signup")
            .open();
        let rabbit = start.step(startup::RABBITMQ, rabbit).await?;
        let text = format!("RabbitMQ ({rabbit:?}), scheduled messages in Postgres");
        let transport: Arc<dyn Transport> = Arc::new(rabbit);
        if options.fresh {
            delete_queues(&transport).await?;
        }
        let store_text = "Postgres (schema courier), with inbox + outbox beside RabbitMQ".to_owned();
        return Ok((transport, Arc::new(store), "postgres", store_text, text));
    }
    if options.fresh {
        delete_database(&options.db)?;
    }
    let broker = start.step(startup::BROKER_FILE, Embedded::open(&options.db)).await?;
    let broker_text = format!("{} (embedded, SQLite)", options.db.display());
    let (store, store_kind, store_text): (Arc<dyn Store>, &str, String) = match &options.postgres {
        Some(url) => {
            let store = start.step(startup::POSTGRES, PostgresStore::connect(url)).await?;
            start.step(startup::MIGRATIONS, store.migrate()).await?;
            (Arc::new(store), "postgres", "Postgres (schema courier)".to_owned())
        }
        None => (
            Arc::new(broker.store()),
            "sqlite",
            "the broker's own file (one SQLite transaction per message)".to_owned(),
        ),
    };
    Ok((Arc::new(broker), store, store_kind, store_text, broker_text))
}

/// Deletes the example's queues (`--fresh` on a server broker).
async fn delete_queues(transport: &Arc<dyn Transport>) -> Result<(), Box<dyn Error>> {
    for queue in ["users", "mailer", "accounts", SCENARIO_QUEUE] {
        match transport.delete(&EntityPath::queue(queue)).await {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), courier::ErrorKind::EntityNotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Deletes the broker's database files, unless another process holds the database.
fn delete_database(db: &Path) -> Result<(), Box<dyn Error>> {
    let with = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    // The broker holds `<db>.lock` while it runs (see `Embedded::open`); hold it too while
    // deleting, so that a running program's database is never pulled from under it.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(with(".lock"))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(format!("{} is in use by another process", db.display()).into());
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
    }
    for path in [db.to_owned(), with("-wal"), with("-shm")] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot delete {}: {e}", path.display()).into()),
        }
    }
    Ok(())
}

/// The scenario parked in the broker by an earlier run, if any (none after `--fresh`,
/// which deleted it: RabbitMQ would wait a second for it).
async fn find_scenario(transport: &Arc<dyn Transport>, fresh: bool) -> Result<Option<Scenario>, Box<dyn Error>> {
    // Read many times over the runs, never handled: a high max delivery count.
    let options = QueueOptions::default().max_delivery_count(10_000);
    transport.create_queue(SCENARIO_QUEUE, &options).await?;
    if fresh {
        return Ok(None);
    }
    let path = EntityPath::queue(SCENARIO_QUEUE);
    if transport.capabilities().bends("S6.1").is_none() {
        let parked = transport.peek(&path, 0, 1).await?;
        return match parked.first() {
            Some(message) => Ok(Some(Scenario::from_envelope(&message.envelope)?)),
            None => Ok(None),
        };
    }
    // A broker that cannot browse (RabbitMQ): take the parked message and put it back.
    let receiver = transport.receiver(&path).await?;
    let mut got = receiver.receive(1, Duration::from_secs(1)).await?;
    match got.pop() {
        Some(delivery) => {
            let scenario = Scenario::from_envelope(&delivery.message().envelope);
            delivery.abandon().await?;
            Ok(Some(scenario?))
        }
        None => Ok(None),
    }
}

/// Prints what an endpoint did in this run.
fn print_stats(name: &str, s: &EndpointStats, report: &ShutdownReport) {
    let timeouts = if s.timeouts_dispatched > 0 {
        format!(
            "; saga timeouts: {} dispatched, {} of them discarded on arrival (cancelled after they were sent)",
            s.timeouts_dispatched, s.timeouts_discarded
        )
    } else {
        String::new()
    };
    println!(
        "{name:<8} handled {:>2} messages, dropped {} duplicates (inbox){timeouts}",
        report.completed, s.duplicates
    );
}

/// What `main` knows of one user.
#[derive(Debug)]
struct Watched {
    member: &'static Member,
    user_id: String,
    /// The latest Persona state heard of.
    persona: Option<PersonaView>,
    /// The checked steps heard of in this run, in order.
    steps: Vec<Step>,
    /// (message id, step) already counted: a retried handling tells its story again.
    seen: HashSet<(String, Step)>,
    /// What the last audit found: (saga, phase).
    found: Vec<(&'static str, &'static str)>,
    /// The endpoints that finished the last audit.
    audited: HashSet<String>,
}

/// `main`'s view of the story: prints it and checks it.
#[derive(Debug)]
struct Watch {
    started_at: DateTime<Utc>,
    timing: Timing,
    users: Vec<Watched>,
    /// Story lines printed.
    lines: usize,
    /// The audits: which one the replies must answer, how many answered another.
    audits: Audits,
}

impl Watch {
    fn new(scenario: &Scenario) -> Self {
        Self {
            started_at: scenario.started_at,
            timing: scenario.timing,
            lines: 0,
            audits: Audits::new(Utc::now().timestamp_millis()),
            users: CAST
                .iter()
                .map(|member| Watched {
                    member,
                    user_id: scenario.user_id(member.name),
                    persona: None,
                    steps: Vec::new(),
                    seen: HashSet::new(),
                    found: Vec::new(),
                    audited: HashSet::new(),
                })
                .collect(),
        }
    }

    fn user(&mut self, user_id: &str) -> Option<&mut Watched> {
        // News of other scenarios (left in a Postgres store) match no one: ignored.
        self.users.iter_mut().find(|w| w.user_id == user_id)
    }

    /// Takes one piece of news in: prints the story, records the rest.
    fn take(&mut self, news: News) {
        let (started_at, timing) = (self.started_at, self.timing);
        match news {
            News::Story {
                at,
                message_id,
                user_id,
                event,
            } => {
                let Some(w) = self.user(&user_id) else { return };
                if let Some(step) = event.step() {
                    if !w.seen.insert((message_id, step)) {
                        return;
                    }
                    w.steps.push(step);
                }
                let name = w.member.name;
                let since = at - started_at;
                self.lines += 1;
                println!(
                    "[{} sim | {:>6.2} s] {name:<5}  {}",
                    clock_text(timing.story(since)),
                    since.as_seconds_f64(),
                    event.text(timing)
                );
            }
            News::Persona(view) => self.persona(view),
            News::PersonaAudited { audit, view } => {
                if self.audits.answers_current(&audit) {
                    self.persona(view);
                }
            }
            News::Found {
                audit,
                user_id,
                saga,
                phase,
            } => {
                if self.audits.answers_current(&audit)
                    && let Some(w) = self.user(&user_id)
                    && !w.found.contains(&(saga, phase))
                {
                    w.found.push((saga, phase)); // (once: a retried handling answers again)
                }
            }
            News::AuditDone {
                audit,
                endpoint,
                user_id,
            } => {
                if self.audits.answers_current(&audit)
                    && let Some(w) = self.user(&user_id)
                {
                    w.audited.insert(endpoint);
                }
            }
        }
    }

    /// Takes in a Persona's state, unless a later one is known.
    fn persona(&mut self, view: PersonaView) {
        if let Some(w) = self.user(&view.user_id)
            && w.persona.as_ref().is_none_or(|p| p.version <= view.version)
        {
            w.persona = Some(view);
        }
    }

    /// Takes news in until `done` holds; `Err` says what was still missing at `deadline`.
    async fn until(
        &mut self,
        news: &mut mpsc::UnboundedReceiver<News>,
        deadline: Instant,
        done: impl Fn(&Self) -> bool,
    ) -> Result<(), String> {
        while !done(self) {
            match tokio::time::timeout_at(deadline, news.recv()).await {
                Ok(Some(n)) => self.take(n),
                Ok(None) => return Err("the handlers' channel closed".to_owned()),
                Err(_) => return Err(self.standings()),
            }
        }
        Ok(())
    }

    fn all_settled(&self) -> bool {
        self.users
            .iter()
            .all(|w| w.persona.as_ref().is_some_and(|p| w.member.is_settled(p.outcome)))
    }

    fn standings(&self) -> String {
        let each: Vec<String> = self
            .users
            .iter()
            .map(|w| {
                let outcome = w.persona.as_ref().map_or(Outcome::Pending, |p| p.outcome);
                format!("{} {outcome}", w.member.name)
            })
            .collect();
        each.join(", ")
    }

    /// Audits every user on `endpoints` and waits for the answers to this audit.
    async fn audit(
        &mut self,
        endpoints: &[&RunningEndpoint],
        news: &mut mpsc::UnboundedReceiver<News>,
    ) -> Result<(), Box<dyn Error>> {
        let id = self.audits.begin();
        for w in &mut self.users {
            w.found.clear();
            w.audited.clear();
            for endpoint in endpoints {
                let audit = Audit {
                    audit: id.clone(),
                    user_id: w.user_id.clone(),
                    login_id: login_id_of(&w.user_id),
                };
                endpoint
                    .bus()
                    .send_with(&audit, SendOptions::new().to(endpoint.name()))
                    .await?;
            }
        }
        let names: Vec<&str> = endpoints.iter().map(|e| e.name()).collect();
        println!(
            "audit {id}: asked {} where each user's sagas stand",
            names.join(" and ")
        );
        let wanted = endpoints.len();
        self.until(news, Instant::now() + AUDIT_WAIT, |w| {
            w.users.iter().all(|u| u.audited.len() == wanted)
        })
        .await
        .map_err(|e| format!("the audit did not finish within {AUDIT_WAIT:?} ({e})"))?;
        Ok(())
    }

    /// Checks every user; prints a line each and says what differed.
    fn verdict(&self, whole_run: bool) -> Result<(), Box<dyn Error>> {
        println!();
        let mut problems = Vec::new();
        for w in &self.users {
            let name = w.member.name;
            let expected = w.member.expected_outcome();
            let mut wrong = Vec::new();
            // 1. The Persona's state: the outcome, and each mail received once.
            match &w.persona {
                None => wrong.push("no Persona state".to_owned()),
                Some(p) => {
                    if p.outcome != expected {
                        wrong.push(format!("ended {}, expected {expected}", p.outcome));
                    }
                    if p.mails != w.member.expected_mails() {
                        wrong.push(format!(
                            "received {} mails, expected {}",
                            p.mails,
                            w.member.expected_mails()
                        ));
                    }
                }
            }
            // 2. The accounts sagas' state: SignUp always completed; Login completed,
            //    except an expired one, which is kept.
            let expected_sagas: &[(&str, &str)] = if expected == Outcome::Refused(Refusal::CodeExpired) {
                &[("Login", "expired")]
            } else {
                &[]
            };
            if w.found != expected_sagas {
                wrong.push(format!(
                    "accounts sagas found {:?}, expected {expected_sagas:?}",
                    w.found
                ));
            }
            // 3. What the handlers told this run: all of it on a whole run, the end of it
            //    on a resumed one.
            let heard_ok = if whole_run {
                w.steps == w.member.expect
            } else {
                w.member.expect.ends_with(&w.steps)
            };
            if !heard_ok {
                wrong.push(format!(
                    "this run saw {:?}, expected {}{:?}",
                    w.steps,
                    if whole_run { "" } else { "an end of " },
                    w.member.expect
                ));
            }
            let sagas = if w.found.is_empty() {
                "no saga left in accounts".to_owned()
            } else {
                let each: Vec<String> = w.found.iter().map(|(s, p)| format!("{s} {p}")).collect();
                format!("accounts keeps {}", each.join(", "))
            };
            let (outcome, mails) = w
                .persona
                .as_ref()
                .map_or(("unknown".to_owned(), 0), |p| (p.outcome.to_string(), p.mails));
            println!(
                "{name:<5}  {outcome:<22} {mails} mail(s), {sagas:<36} {}",
                if wrong.is_empty() { "ok" } else { "WRONG" }
            );
            problems.extend(wrong.into_iter().map(|p| format!("{name}: {p}")));
        }
        if problems.is_empty() {
            println!(
                "ok: every user ended as the script says{}",
                if whole_run { "" } else { " (scenario resumed)" }
            );
            Ok(())
        } else {
            Err(format!("\n  - {}", problems.join("\n  - ")).into())
        }
    }
}
