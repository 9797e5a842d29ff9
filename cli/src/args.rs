//! The command line's grammar (clap derive): where to connect, the commands and their
//! options. Help texts here are what `courier --help` shows.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// What `--help` says of the exit codes.
const EXIT_CODES: &str = "Exit codes: 0 ok; 1 the operation failed; 2 bad usage; 3 not found (a queue, a \
     message, a saga instance, or some of the messages given); 4 refused (a file in use by a running broker, a \
     database without Courier's tables, ...); 5 cannot connect; 6 not confirmed.";

/// Look at and repair a Courier system: queues, dead letters, sagas, timeouts, outbox,
/// and a workflow's history; from the command line, or in a browser with `courier
/// serve` (the web console).
#[derive(Debug, Parser)]
#[command(name = "courier", version, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) target: Target,

    /// Print JSON instead of tables (for scripts).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// Do not ask for confirmation before a change.
    #[arg(long, short = 'y', global = true)]
    pub(crate) yes: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the system keeps its messages and state.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The embedded broker's file (its queues, and the sagas, timeouts and outbox of
    /// `Embedded::store`). Read-only while the application that runs it is up.
    #[arg(long, value_name = "FILE", env = "COURIER_EMBEDDED", global = true)]
    pub(crate) embedded: Option<PathBuf>,

    /// The Postgres store's database (`postgres://user:password@host/db`): sagas,
    /// timeouts, outbox. Prefer the environment variable to keep the password out of
    /// the shell's history.
    #[arg(
        long,
        value_name = "URL",
        env = "COURIER_POSTGRES",
        hide_env_values = true,
        global = true,
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    pub(crate) postgres: Option<String>,

    /// The SQLite store's file: sagas, timeouts, outbox (and, with `--rabbitmq`, the
    /// transport's scheduled messages, the queues it declared and its parked dead
    /// letters).
    #[arg(
        long,
        value_name = "FILE",
        env = "COURIER_SQLITE",
        global = true,
        conflicts_with = "postgres"
    )]
    pub(crate) sqlite: Option<PathBuf>,

    /// RabbitMQ (`amqp://user:password@host:5672/vhost`; a cluster's nodes as hosts
    /// separated by commas, `amqp://user:password@h1:5672,h2:5672/vhost`): queues and dead letters. With
    /// `--postgres` or `--sqlite`, its schedule store: the queues the transport declared
    /// are listed from there, with their scheduled messages; dead letters (which stay in
    /// RabbitMQ) are numbered there, and the seals of their records checked with the
    /// secret kept there (the `dlq` commands need it). Prefer the environment variable to
    /// keep the password out of the shell's history.
    #[arg(
        long,
        value_name = "URL",
        env = "COURIER_RABBITMQ",
        hide_env_values = true,
        global = true,
        conflicts_with = "embedded",
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    pub(crate) rabbitmq: Option<String>,

    /// With `--rabbitmq`: RabbitMQ's management HTTP API
    /// (`http://user:password@host:15672`; without a user and password, the AMQP URL's),
    /// read for the number of unacknowledged messages of each queue (`LOCKED`), which
    /// AMQP does not tell. Needs the management plugin (`rabbitmq-plugins enable
    /// rabbitmq_management`); when it cannot be reached, `queues` still lists the AMQP
    /// counts and warns. Plain HTTP only. For a cluster, several nodes' addresses
    /// separated by commas: the first that answers is read. Prefer the environment
    /// variable to keep the password out of the shell's history.
    // Not clap's `requires = "rabbitmq"`: on a global option it fails when the two are
    // given on different levels (`courier --rabbitmq URL queues --rabbitmq-management
    // URL`, or one from the environment); `run` checks it.
    #[arg(
        long,
        value_name = "URL",
        env = "COURIER_RABBITMQ_MANAGEMENT",
        hide_env_values = true,
        global = true
    )]
    pub(crate) rabbitmq_management: Option<String>,

    /// With `--rabbitmq`: also list this queue, topic or subscription
    /// (`topic/subscriptions/name`), one the transport did not record (repeatable).
    #[arg(long, value_name = "NAME", global = true, requires = "rabbitmq")]
    pub(crate) rabbitmq_queue: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Queues, topics and subscriptions with their counts and the age of the oldest
    /// active message.
    Queues,
    /// The dead letters of a queue.
    #[command(subcommand, name = "dlq")]
    DeadLetters(DlqCommand),
    /// Saga instances.
    #[command(subcommand)]
    Sagas(SagaCommand),
    /// Pending saga timeouts, earliest due first.
    Timeouts(TimeoutArgs),
    /// Messages stored in the outbox and not dispatched yet.
    Outbox(OutboxArgs),
    /// A workflow's history, as endpoints with `EndpointBuilder::history` record it: a
    /// saga instance's timeline, or the tree of messages a message caused.
    #[command(subcommand)]
    History(HistoryCommand),
    /// Serve the web console: the same pages in a browser (dashboard, dead letters,
    /// sagas, timeouts, outbox), until Ctrl-C.
    Serve(ServeArgs),
}

/// `courier serve`: where the console listens and how it is protected.
#[derive(Debug, Args)]
#[command(
    after_help = "Security: without a token the console listens only on loopback and answers only \
     requests addressed to a loopback name; any other address needs --token (or COURIER_CONSOLE_TOKEN), which \
     every request must present (the login form sets a cookie; scripts send `Authorization: Bearer TOKEN`). \
     Every change is a POST with a CSRF token. See docs/console.md."
)]
pub(crate) struct ServeArgs {
    /// The address to listen on (IP:PORT). Anything but loopback needs a token.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// The access token every request must present (at least 16 characters; e.g. the
    /// output of `openssl rand -hex 32`). Prefer the environment variable.
    #[arg(long, value_name = "TOKEN", env = "COURIER_CONSOLE_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// How often the dashboard's dead-letter counts are sampled (its sparklines show the
    /// last hour of these samples, kept in memory from the console's start).
    #[arg(long, value_name = "AGE", default_value = "30s", value_parser = crate::output::parse_age)]
    pub(crate) sample_every: chrono::Duration,
}

#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// A page of dead letters: sequence number, id, type, reason, failure.
    List {
        /// The queue (or `topic/subscriptions/name`).
        queue: String,
        /// Start after this sequence number (the previous page's last).
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// At most this many (1000 at most).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One dead letter in full: headers, reason, failure, body.
    Show {
        /// The queue.
        queue: String,
        /// Its sequence number (from `dlq list`).
        sequence_number: i64,
        /// Print the whole body and error texts (by default each is cut after 4,096
        /// characters, saying how much more there is).
        #[arg(long)]
        full: bool,
    },
    /// Move dead letters back to their queue (same message id, delivery count from zero).
    Resubmit(Change),
    /// Delete dead letters for good.
    Delete(Change),
}

/// Which dead letters a change takes.
#[derive(Debug, Args)]
pub(crate) struct Change {
    /// The queue.
    pub(crate) queue: String,
    /// Sequence numbers (from `dlq list`).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub(crate) sequence_numbers: Vec<i64>,
    /// Every dead letter of the queue now (not those that come back meanwhile).
    #[arg(long)]
    pub(crate) all: bool,
    /// Show what would change, change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SagaCommand {
    /// Saga types with their number of instances.
    Types,
    /// Instances of a saga, least recently updated first.
    List {
        /// The saga's name.
        saga: String,
        /// Only correlations that contain this text.
        #[arg(long)]
        correlation: Option<String>,
        /// Only instances not updated for this long (`90s`, `15m`, `2h`, `3d`).
        #[arg(long, value_parser = crate::output::parse_age)]
        older_than: Option<chrono::Duration>,
        /// Only instances with a pending timeout.
        #[arg(long, conflicts_with = "without_timeout")]
        with_timeout: bool,
        /// Only instances without a pending timeout.
        #[arg(long)]
        without_timeout: bool,
        /// At most this many (1000 at most).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One instance: state, version, pending timeouts.
    Show {
        /// The saga's name.
        saga: String,
        /// The instance's correlation value.
        correlation: String,
    },
    /// Complete (delete) an instance by hand, with its pending timeouts; the reason is
    /// logged.
    Complete {
        /// The saga's name.
        saga: String,
        /// The instance's correlation value.
        correlation: String,
        /// Why (logged with the saga, the correlation and the version).
        #[arg(long)]
        reason: String,
        /// Show the instance, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct TimeoutArgs {
    /// Only overdue ones: due and not sent, or sent and not handled within the grace.
    #[arg(long)]
    pub(crate) overdue: bool,
    /// How long a sent timeout may stay unhandled before it counts as overdue.
    #[arg(long, default_value = "60s", value_parser = crate::output::parse_age)]
    pub(crate) grace: chrono::Duration,
    /// At most this many (1000 at most).
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct OutboxArgs {
    /// The outbox's dead letters (refused for good at dispatch) instead.
    #[arg(long)]
    pub(crate) dead: bool,
    /// At most this many (1000 at most).
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: u32,
}

#[derive(Debug, Subcommand)]
pub(crate) enum HistoryCommand {
    /// A saga instance's timeline, oldest first: each message it handled (time, type,
    /// id, outcome), what it changed in the state, what it sent, its timeouts; and the
    /// failed attempts of its messages.
    Saga {
        /// The saga's name.
        saga: String,
        /// The instance's correlation value.
        correlation: String,
        #[command(flatten)]
        filter: HistoryArgs,
    },
    /// A message's events and, as a tree, the messages it caused across endpoints (each
    /// with its endpoints and outcomes), its timeouts, and what was sent but not handled
    /// yet.
    Message {
        /// The message's id.
        id: String,
        #[command(flatten)]
        filter: HistoryArgs,
    },
    /// The events, newest first, that hold a text (an e-mail address, an order number,
    /// an id) in a kept body, a saga state, an error or an id, and the saga instances
    /// they name, each with the command that prints its timeline. Reads every event the
    /// filters let through: narrow a large history with --since.
    Find {
        /// The text to find (as it is written in the message or the state).
        text: String,
        #[command(flatten)]
        filter: HistoryArgs,
    },
}

/// Which events of a history to print.
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// Only events at or after this time (RFC 3339: `2026-12-03T10:00:00Z`).
    #[arg(long, value_name = "TIME", value_parser = crate::output::parse_time)]
    pub(crate) since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only events at or before this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = crate::output::parse_time)]
    pub(crate) until: Option<chrono::DateTime<chrono::Utc>>,
    /// Only events of this outcome: handled, retried, dead_lettered, duplicate,
    /// timeout_dispatched or timeout_dead_lettered (repeatable).
    #[arg(long, value_name = "OUTCOME", value_parser = crate::output::parse_outcome)]
    pub(crate) outcome: Vec<courier::HistoryKind>,
    /// Read at most this many events (10000 at most).
    #[arg(long, default_value_t = 1000)]
    pub(crate) limit: u32,
}
