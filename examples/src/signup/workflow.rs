//! The workflow: the messages of `accounts` and `mailer`, the `SignUp` and `Login` sagas
//! and the mailer's handlers; read it first. Around it, `main.rs` runs it, `users.rs` plays
//! its users, `audit.rs` and `watch.rs` check it, `setup.rs` picks transport and store, and
//! `story.rs` carries what handlers report to `main` and the time factor (`Timing`).

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use courier::prelude::*;
use courier::saga::SagaContext;
use serde::{Deserialize, Serialize};

use crate::audit::{Audit, found};
use crate::story::{Event, Timing, story};
use crate::users::{Mail, MailDelivered};

/// How long a new user has to confirm the e-mail address.
pub(crate) const CONFIRMATION_WINDOW: Duration = Duration::from_secs(3600);
/// How long a two-factor code is valid.
pub(crate) const CODE_VALIDITY: Duration = Duration::from_secs(5 * 60);

/// A user filled in the sign-up form (a command to `accounts`).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.UserRegistered")]
pub(crate) struct UserRegistered {
    pub(crate) user_id: String,
    /// Where to send the confirmation mail.
    pub(crate) email: String,
}

/// A user clicked the link of the confirmation mail.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.EmailConfirmed")]
pub(crate) struct EmailConfirmed {
    pub(crate) user_id: String,
}

/// `SignUp`'s timeout: the hour is up.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.ConfirmationExpired")]
pub(crate) struct ConfirmationExpired;

/// Event: the account is active.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.UserActivated")]
pub(crate) struct UserActivated {
    pub(crate) user_id: String,
}

/// Event: the account was removed, unconfirmed.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.UserRemoved")]
pub(crate) struct UserRemoved {
    pub(crate) user_id: String,
}

/// A user asked to log in (after typing the password, which this example leaves out).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.LoginRequested")]
pub(crate) struct LoginRequested {
    pub(crate) login_id: String,
    pub(crate) user_id: String,
    /// Where to send the code.
    pub(crate) email: String,
}

/// A user typed a two-factor code.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.CodeEntered")]
pub(crate) struct CodeEntered {
    pub(crate) login_id: String,
    pub(crate) code: String,
    /// When they typed it (stamped by the user's side, as a web front end would).
    pub(crate) entered_at: DateTime<Utc>,
}

/// `Login`'s timeout: the code expired.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.CodeExpiry")]
pub(crate) struct CodeExpiry;

/// Event: a login succeeded.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.LoginSucceeded")]
pub(crate) struct LoginSucceeded {
    pub(crate) login_id: String,
    pub(crate) user_id: String,
}

/// Event: a code was refused.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "accounts.LoginRefused")]
pub(crate) struct LoginRefused {
    pub(crate) login_id: String,
    pub(crate) user_id: String,
    pub(crate) reason: Refusal,
}

/// Why a code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) enum Refusal {
    /// It was typed after its expiry.
    CodeExpired,
    /// It is not the code that was sent.
    WrongCode,
}

/// A command to `mailer`: send the confirmation mail.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "mailer.SendConfirmationMail")]
pub(crate) struct SendConfirmationMail {
    pub(crate) user_id: String,
    pub(crate) email: String,
}

/// A command to `mailer`: send a two-factor code.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "mailer.SendLoginCode")]
pub(crate) struct SendLoginCode {
    pub(crate) user_id: String,
    pub(crate) email: String,
    pub(crate) login_id: String,
    pub(crate) code: String,
}

/// A six-digit code derived from the login id (FNV-1a), so that runs are reproducible.
pub(crate) fn two_factor_code(login_id: &str) -> String {
    let hash = login_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("{:06}", hash % 1_000_000)
}

// `accounts`: the SignUp and Login sagas.

/// A sign-up waiting for its confirmation.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct SignUp {
    /// Where the confirmation mail went.
    pub(crate) email: String,
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
        found(ctx, q, "SignUp", "awaiting confirmation")
    }
}

/// A login waiting for its two-factor code.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Login {
    pub(crate) user_id: String,
    /// The code sent.
    pub(crate) code: String,
    /// When it was sent.
    pub(crate) issued_at: DateTime<Utc>,
    /// Until when it is valid.
    pub(crate) expires_at: DateTime<Utc>,
    /// The code expired: every code is refused from now on.
    pub(crate) expired: bool,
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
        found(ctx, q, "Login", phase)
    }
}

// `mailer`: sends the mails (to the simulated users' mailboxes).

#[courier::handler]
pub(crate) async fn send_confirmation_mail(cmd: SendConfirmationMail, ctx: &mut Context) -> Result<(), HandlerError> {
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
pub(crate) async fn send_login_code(cmd: SendLoginCode, ctx: &mut Context) -> Result<(), HandlerError> {
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
