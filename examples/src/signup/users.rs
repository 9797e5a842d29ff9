//! The simulated users: the cast (who does what, and what should come of it) and the
//! `Persona` saga that plays each user, with the messages only the users receive
//! (`Arrive`, `MailDelivered`). A user's actions are scheduled messages sent from the
//! Persona's handlers. Nothing here belongs to the workflow (`workflow.rs`).

use std::fmt;

use courier::prelude::*;
use courier::saga::SagaContext;
use serde::{Deserialize, Serialize};

use crate::audit::Audit;
use crate::story::{Event, News, Timing, story, tell};
use crate::workflow::{
    CodeEntered, EmailConfirmed, LoginRefused, LoginRequested, LoginSucceeded, Refusal, UserActivated, UserRegistered,
    UserRemoved,
};

// ---------------------------------------------------------------------------------------
// The cast: who does what, and what should come of it.
// ---------------------------------------------------------------------------------------

/// A simulated user's script and the steps that should follow from it, in order.
#[derive(Debug)]
pub(crate) struct Member {
    /// The user's name (their e-mail is `<name>@example.com`).
    pub(crate) name: &'static str,
    /// When they sign up, in minutes after the start.
    pub(crate) arrives: u64,
    /// Minutes after the confirmation mail until they click its link; `None`: never.
    pub(crate) confirms_after: Option<u64>,
    /// Minutes after their activation until they log in; `None`: they don't.
    pub(crate) logs_in_after: Option<u64>,
    /// Minutes after the code mail until they type the code.
    pub(crate) enters_code_after: Option<u64>,
    /// What should happen to them, in order.
    pub(crate) expect: &'static [Step],
}

/// A step of a user's story that the program checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Step {
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

pub(crate) const CAST: &[Member] = &[
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
    pub(crate) fn named(name: &str) -> Option<&'static Member> {
        CAST.iter().find(|m| m.name == name)
    }

    /// How their story should end.
    pub(crate) fn expected_outcome(&self) -> Outcome {
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
    pub(crate) fn expected_mails(&self) -> u32 {
        let mails = self
            .expect
            .iter()
            .filter(|s| matches!(s, Step::ConfirmationMail | Step::CodeMail))
            .count();
        u32::try_from(mails).unwrap_or(u32::MAX)
    }

    /// Whether a user of this script with `outcome` has nothing left to do.
    pub(crate) fn is_settled(&self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Pending => false,
            Outcome::Activated => self.logs_in_after.is_none(),
            Outcome::Removed | Outcome::LoggedIn | Outcome::Refused(_) => true,
        }
    }
}

/// A mail arrived in a (simulated) user's mailbox.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "users.MailDelivered")]
pub(crate) struct MailDelivered {
    /// The user.
    pub(crate) user_id: String,
    /// What the mail says.
    pub(crate) mail: Mail,
}

/// What a mail says.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Mail {
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
pub(crate) struct Arrive {
    /// The user.
    pub(crate) user_id: String,
    /// Their name in the cast.
    pub(crate) name: String,
}

/// The login id of a user's (only) login in this story.
pub(crate) fn login_id_of(user_id: &str) -> String {
    format!("{user_id}.login")
}

// ---------------------------------------------------------------------------------------
// `users`: the simulated users.
// ---------------------------------------------------------------------------------------

/// Where a user's story stands, as their Persona sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PersonaView {
    /// The user.
    pub(crate) user_id: String,
    /// Where they stand.
    pub(crate) outcome: Outcome,
    /// Mails received.
    pub(crate) mails: u32,
    /// One more at each change.
    pub(crate) version: u32,
}

/// A simulated user: follows their script, remembers what happened to them.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Persona {
    /// The user.
    pub(crate) user_id: String,
    /// Their name in the cast.
    pub(crate) name: String,
    /// Where they stand.
    pub(crate) outcome: Outcome,
    /// Mails received.
    pub(crate) mails: u32,
    /// One more at each change.
    pub(crate) version: u32,
}

impl Persona {
    pub(crate) fn script(&self) -> Option<&'static Member> {
        Member::named(&self.name)
    }

    pub(crate) fn email(&self) -> String {
        format!("{}@example.com", self.name)
    }

    pub(crate) fn view(&self) -> PersonaView {
        PersonaView {
            user_id: self.user_id.clone(),
            outcome: self.outcome,
            mails: self.mails,
            version: self.version,
        }
    }

    /// Records a change and tells `main`.
    pub(crate) fn changed(&mut self, ctx: &mut Context) -> Result<(), HandlerError> {
        self.version += 1;
        tell(ctx, News::Persona(self.view()))
    }

    pub(crate) fn intends(&self, ctx: &mut Context, what: String) -> Result<(), HandlerError> {
        story(ctx, &self.user_id, Event::Intends(what))
    }

    /// A finished story (the outcome is told to `main` by `changed`).
    pub(crate) fn ends(&mut self, outcome: Outcome, ctx: &mut Context) -> Result<(), HandlerError> {
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
