//! The web console: `courier serve`, server-rendered pages over `courier::admin`.
//!
//! The pages:
//!
//! * `/`: the dashboard of queues, topics and subscriptions with their counts and a
//!   sparkline of each one's dead-letter count over the last hour, and a line about the
//!   store;
//! * `/dlq?queue=`: a queue's dead letters (a paged list; resubmit and delete one,
//!   selected or all); `/dlq/message?queue=&seq=`: one in full, with a link to its
//!   message's history when the console has one;
//! * `/sagas`, `/sagas/list?saga=`, `/sagas/instance?saga=&correlation=`: saga types,
//!   instances filtered by correlation, age and pending timeout, one instance's state
//!   (with a link to its history; complete it by hand with a reason);
//! * `/timeouts`: pending and overdue timeouts; `/outbox`: the outbox and its dead letters;
//! * `/history/saga?saga=&correlation=`: a saga instance's timeline (issue 33,
//!   docs/history.md): a time axis of its events and timeouts, each event with its
//!   outcome, its state's diff, its timeouts and the messages it sent;
//! * `/history/message?id=`: a message's events and the conversation it caused, drawn as
//!   a sequence diagram across the endpoints;
//! * `/login`, `/logout` when a token is required.
//!
//! Plain HTML forms and inline SVG, no script: the pages work in any browser and under a
//! content security policy that allows no script at all.
//!
//! The console is built over the traits [`QueueAdmin`], [`StoreAdmin`] and
//! [`HistoryAdmin`], so every broker and store that implements them works without a
//! change here; a part not given shows a page saying what to pass.
//!
//! Security (see `security.rs`): without a token it answers only requests from loopback
//! addressed to a loopback name, and [`Console::serve`] refuses to listen on another
//! address; with a token every request must present it (a login opens a session of its
//! own, `session.rs`, with an `HttpOnly`, `SameSite=Strict` cookie; or the header
//! `Authorization: Bearer TOKEN`). Every change is a POST carrying the CSRF token of its
//! session (or, without sessions, the process's); GET never changes anything. Every value
//! from a message or a store is HTML-escaped (maud escapes by default), and connection
//! passwords are never shown (the admins' `describe()`).
//!
//! An embedded broker's file that `courier serve` shows is an [`EmbeddedFile`]: read
//! without the broker's lock, opened as the broker only for a change, so the application
//! can start while the console serves; the console is read-only while it runs, and every
//! page says so ([`Console::read_only_when`]).
//!
//! Modules: `security.rs` (the checks every request passes, login and logout),
//! `session.rs` (the login sessions), `embedded.rs` (a broker file served without its
//! lock), `history.rs` (the sampled dead-letter counts and their sparkline), `layout.rs`
//! (the page frame, style, formats, error pages), `queues.rs` (dashboard and dead
//! letters), `store.rs` (sagas, timeouts, outbox); the workflow history's pages:
//! `events.rs` (what they share: filters, links, outcomes), `timeline.rs` (a saga's
//! timeline), `svg.rs` (its time axis), `conversation.rs` (a message's page) and
//! `sequence.rs` (its sequence diagram).
//!
//! # Examples
//!
//! Serving the console inside an application, over its running embedded broker (the only
//! way to change a broker file that an application holds):
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use courier::Embedded;
//! use courier::admin::EmbeddedAdmin;
//! use courier_cli::console::Console;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = Embedded::open("app.db").await?;
//! let admin = Arc::new(EmbeddedAdmin::new(broker.clone()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! Console::new()
//!     .queues(admin.clone())
//!     .store(admin.clone())
//!     .history(admin)
//!     .serve(listener, async { tokio::signal::ctrl_c().await.ok(); })
//!     .await?;
//! # Ok(()) }
//! ```

mod conversation;
mod embedded;
mod events;
mod history;
mod layout;
mod queues;
mod security;
mod sequence;
mod session;
mod store;
mod svg;
mod timeline;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use courier::Clock;
use courier::admin::{HistoryAdmin, QueueAdmin, StoreAdmin};

pub use self::embedded::EmbeddedFile;
use self::history::History;
pub use self::session::{IDLE as SESSION_IDLE, MAX_AGE as SESSION_MAX_AGE, MAX_SESSIONS};

/// The shortest access token the console accepts.
pub const MIN_TOKEN_LEN: usize = 16;

/// How often the console samples the dead-letter counts by default.
pub const DEFAULT_SAMPLE_EVERY: Duration = Duration::from_secs(30);

/// Why the console cannot start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// A non-loopback address without an access token.
    #[error(
        "the console would listen on {addr}, which is not a loopback address, without an access token: anyone who \
         can reach it could resubmit and delete messages. Give a token (--token, or the environment variable \
         COURIER_CONSOLE_TOKEN; a long random value such as the output of `openssl rand -hex 32`), or listen on \
         127.0.0.1"
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// A token too short to be a secret.
    #[error(
        "the access token is {len} characters long: use at least {MIN_TOKEN_LEN} (a long random value such as \
         the output of `openssl rand -hex 32`)"
    )]
    WeakToken {
        /// Its length.
        len: usize,
    },
    /// The listener failed (its address, or the server).
    #[error("the console's listener failed: {0}; check the address (--listen) and that no other process uses it")]
    Io(#[from] std::io::Error),
}

/// The web console: what it shows, and how it is protected. Build it, then
/// [`serve`](Self::serve) it on a listener or take its [`router`](Self::router).
#[derive(Clone)]
pub struct Console {
    queues: Option<Arc<dyn QueueAdmin>>,
    store: Option<Arc<dyn StoreAdmin>>,
    workflow_history: Option<Arc<dyn HistoryAdmin>>,
    token: Option<String>,
    sample_every: Duration,
    clock: Arc<dyn Clock>,
    read_only: Option<ReadOnlyProbe>,
}

/// Says why the console is read-only now, or `None`.
type ReadOnlyProbe = Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("queues", &self.queues.as_ref().map(|q| q.describe()))
            .field("store", &self.store.as_ref().map(|s| s.describe()))
            .field("history", &self.workflow_history.as_ref().map(|h| h.describe()))
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("sample_every", &self.sample_every)
            .field("clock", &self.clock)
            .field("read_only", &self.read_only.as_ref().map(|p| p()))
            .finish()
    }
}

impl Default for Console {
    fn default() -> Self {
        Self::new()
    }
}

impl Console {
    /// A console showing nothing yet, without a token, sampling every
    /// [`DEFAULT_SAMPLE_EVERY`].
    pub fn new() -> Self {
        Self {
            queues: None,
            store: None,
            workflow_history: None,
            token: None,
            sample_every: DEFAULT_SAMPLE_EVERY,
            clock: Arc::new(courier::SystemClock),
            read_only: None,
        }
    }

    /// An embedded broker's file, served without holding it ([`EmbeddedFile`]): its
    /// queues, its store and its history, and a banner on every page while an
    /// application runs it (the console is read-only then).
    #[must_use]
    pub fn embedded_file(self, file: Arc<EmbeddedFile>) -> Self {
        let probe = file.clone();
        self.queues(file.clone())
            .store(file.clone())
            .history(file)
            .read_only_when(move || probe.read_only_reason())
    }

    /// A banner on every page while `reason` says why the console is read-only now (it is
    /// asked at each page).
    #[must_use]
    pub fn read_only_when(mut self, reason: impl Fn() -> Option<String> + Send + Sync + 'static) -> Self {
        self.read_only = Some(Arc::new(reason));
        self
    }

    /// The clock the login sessions' expiry is measured on (the system's by default; a
    /// test drives a `courier::VirtualClock`).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The broker whose queues and dead letters it shows.
    #[must_use]
    pub fn queues(mut self, admin: Arc<dyn QueueAdmin>) -> Self {
        self.queues = Some(admin);
        self
    }

    /// The store whose sagas, timeouts and outbox it shows.
    #[must_use]
    pub fn store(mut self, admin: Arc<dyn StoreAdmin>) -> Self {
        self.store = Some(admin);
        self
    }

    /// The store whose workflow history it shows (docs/history.md): a saga instance's
    /// timeline, a message's page with its conversation as a sequence diagram, and a link
    /// from each dead letter to its message's history. Usually the same store as
    /// [`store`](Self::store)'s (an `EmbeddedAdmin`, `SqliteAdmin` or `PostgresAdmin`).
    #[must_use]
    pub fn history(mut self, admin: Arc<dyn HistoryAdmin>) -> Self {
        self.workflow_history = Some(admin);
        self
    }

    /// The access token every request must present (required to listen on a
    /// non-loopback address).
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How often the dead-letter counts are sampled for the dashboard's sparklines (the
    /// history is kept in memory for an hour; at least every 100 ms).
    #[must_use]
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.sample_every = every.max(Duration::from_millis(100));
        self
    }

    /// Checks the token's strength and that `addr` may be served (loopback, or a token).
    ///
    /// # Errors
    /// [`ConsoleError::TokenRequired`] or [`ConsoleError::WeakToken`].
    pub fn check_listen(&self, addr: SocketAddr) -> Result<(), ConsoleError> {
        if let Some(token) = &self.token {
            let len = token.chars().count();
            if len < MIN_TOKEN_LEN {
                return Err(ConsoleError::WeakToken { len });
            }
        } else if !addr.ip().is_loopback() {
            return Err(ConsoleError::TokenRequired { addr });
        }
        Ok(())
    }

    /// The console's pages as an axum router, to serve as you like. It starts the
    /// sampler of dead-letter counts (a task that ends when the router is dropped), so
    /// it must be called inside a Tokio runtime.
    ///
    /// Without a token the router answers only requests from a loopback address whose
    /// `Host` is a loopback name (`localhost`, `127.0.0.1`, `[::1]`); it learns the
    /// peer's address from axum's `ConnectInfo`, so serve it with
    /// `into_make_service_with_connect_info::<SocketAddr>()` (else it refuses every
    /// request), or give a token.
    ///
    /// # Errors
    /// [`ConsoleError::WeakToken`] if the token is too short.
    pub fn router(self) -> Result<Router, ConsoleError> {
        if let Some(token) = &self.token {
            let len = token.chars().count();
            if len < MIN_TOKEN_LEN {
                return Err(ConsoleError::WeakToken { len });
            }
        }
        let history = Arc::new(History::new(self.sample_every));
        if let Some(queues) = &self.queues {
            history::start_sampler(Arc::downgrade(&history), queues.clone(), self.sample_every);
        }
        let state = Arc::new(State {
            queues: self.queues,
            store: self.store,
            workflow_history: self.workflow_history,
            access: self
                .token
                .map(|t| security::Access::new(t, session::Sessions::new(self.clock.clone()))),
            csrf: security::random_token(),
            history,
            read_only: self.read_only,
        });
        Ok(Router::new()
            .route("/", get(queues::dashboard))
            .route("/dlq", get(queues::dead_letters))
            .route("/dlq/message", get(queues::dead_letter))
            .route("/dlq/resubmit", post(queues::resubmit))
            .route("/dlq/delete", post(queues::delete))
            .route("/sagas", get(store::saga_types))
            .route("/sagas/list", get(store::sagas))
            .route("/sagas/instance", get(store::saga))
            .route("/sagas/complete", post(store::complete))
            .route("/timeouts", get(store::timeouts))
            .route("/outbox", get(store::outbox))
            .route("/history/saga", get(timeline::saga_history))
            .route("/history/message", get(conversation::message_history))
            .route("/login", get(security::login_page).post(security::login))
            .route("/logout", post(security::logout))
            .fallback(layout::not_found)
            .layer(axum::middleware::from_fn_with_state(state.clone(), security::guard))
            .with_state(state))
    }

    /// Serves the console on `listener` until `shutdown` completes.
    ///
    /// # Errors
    /// [`ConsoleError::TokenRequired`] if the listener is not on loopback and there is no
    /// token; [`ConsoleError::WeakToken`]; [`ConsoleError::Io`] if the server fails.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ConsoleError> {
        self.check_listen(listener.local_addr()?)?;
        let router = self.router()?;
        axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(shutdown)
            .await?;
        Ok(())
    }
}

/// What every handler shares.
pub(crate) struct State {
    pub(crate) queues: Option<Arc<dyn QueueAdmin>>,
    pub(crate) store: Option<Arc<dyn StoreAdmin>>,
    /// The workflow history (issue 33), when given.
    pub(crate) workflow_history: Option<Arc<dyn HistoryAdmin>>,
    /// The access token and the sessions, when a token is required.
    pub(crate) access: Option<security::Access>,
    /// The process's CSRF token: in every form when there is no token, and in the forms of
    /// requests with the bearer token (never on a session's page or the login form).
    pub(crate) csrf: String,
    /// The sampled dead-letter counts.
    pub(crate) history: Arc<History>,
    /// Why the console is read-only now.
    pub(crate) read_only: Option<ReadOnlyProbe>,
}

impl State {
    /// Why the console is read-only now (the banner's text), or `None`.
    pub(crate) fn read_only_note(&self) -> Option<String> {
        self.read_only.as_ref().and_then(|p| p())
    }
}

/// The shared state as handlers take it.
pub(crate) type Shared = axum::extract::State<Arc<State>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_loopback_address_needs_a_token_of_some_length() {
        let any: SocketAddr = "0.0.0.0:8080"
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 8080)));
        let local = SocketAddr::from(([127, 0, 0, 1], 8080));
        let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 8080));
        assert!(Console::new().check_listen(local).is_ok());
        assert!(Console::new().check_listen(v6).is_ok());
        let err = Console::new().check_listen(any);
        assert!(matches!(err, Err(ConsoleError::TokenRequired { .. })), "{err:?}");
        let message = err.map_or_else(|e| e.to_string(), |()| String::new());
        assert!(
            message.contains("--token") && message.contains("COURIER_CONSOLE_TOKEN"),
            "{message}"
        );
        assert!(matches!(
            Console::new().token("short").check_listen(any),
            Err(ConsoleError::WeakToken { len: 5 })
        ));
        assert!(Console::new().token("a-long-enough-token").check_listen(any).is_ok());
    }
}
