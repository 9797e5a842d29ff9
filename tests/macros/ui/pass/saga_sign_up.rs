//! The sign-up saga of the issue in full: a start correlated by a field, a continuation
//! correlated by a header with its own error type, a timeout, and a helper method that
//! `#[saga]` leaves alone. It registers on an endpoint.

use std::time::Duration;

use courier::saga::{SagaContext, TimeoutHandle};
use courier::{HandlerError, Message};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Message)]
struct UserRegistered {
    user_id: String,
    email: String,
}

#[derive(Serialize, Deserialize, Message)]
struct EmailConfirmed;

#[derive(Serialize, Deserialize, Message)]
struct ConfirmationExpired;

#[derive(Debug, thiserror::Error)]
#[error("the account store is down")]
struct MyError;

#[derive(Default, Serialize, Deserialize)]
struct SignUp {
    user: String,
    confirmed: bool,
    reminder: Option<TimeoutHandle>,
}

#[courier::saga]
impl SignUp {
    /// A user registered: wait an hour for the confirmation.
    #[start(by = user_id)]
    async fn registered(&mut self, msg: UserRegistered, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.user = msg.user_id;
        let _ = msg.email;
        self.reminder = Some(ctx.request_timeout(Duration::from_secs(3600), &ConfirmationExpired)?);
        Ok(())
    }

    #[handle(header = "x-user-id")]
    async fn confirmed(&mut self, _msg: EmailConfirmed, ctx: &mut SagaContext<'_>) -> Result<(), MyError> {
        if self.is_pending() {
            self.confirmed = true;
        }
        if let Some(reminder) = self.reminder.take() {
            ctx.cancel_timeout_handle(&reminder);
        }
        ctx.cancel_timeout::<ConfirmationExpired>();
        ctx.complete();
        Ok(())
    }

    #[timeout]
    async fn expired(&mut self, _msg: ConfirmationExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }

    fn is_pending(&self) -> bool {
        !self.confirmed
    }
}

fn main() {
    let _ = courier::Endpoint::builder("accounts").saga::<SignUp>();
    assert_eq!(<SignUp as courier::saga::Saga>::NAME, concat!(module_path!(), "::SignUp"));
}
