//! `courier`: the operations command line of Courier. Lists queues and their dead
//! letters, resubmits or deletes dead letters, shows and completes saga instances, lists
//! pending and overdue timeouts and the outbox, prints a workflow's history (`history`: a
//! saga instance's timeline, a message's conversation); serves the same as web pages
//! (`serve`, the library's `courier_cli::console`); against an embedded broker's file
//! (`--embedded`), a Postgres database (`--postgres`: the store, and the Postgres
//! transport's queues), a SQLite store (`--sqlite`), or RabbitMQ (`--rabbitmq`, with
//! `--postgres` or `--sqlite` as its schedule store, and `--rabbitmq-management` for the
//! unacknowledged counts).
//!
//! A thin layer over `courier::admin`: `args.rs` is the grammar, `commands.rs` runs the
//! commands (`history.rs` the history's), `output.rs` prints, `serve.rs` starts the web
//! console. Exit codes are documented in `--help` and in docs/operations.md. Install with
//! `cargo install --path cli`.

/// Writes a line to standard error, as `eprintln!` does, but a standard error that is
/// closed (the reader went away: a pipe, a supervisor that stopped reading) is no reason
/// to stop the command: `eprintln!` panics then, and a console serving its users died
/// with it.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say_line(format_args!($($arg)*))
    };
}

mod args;
mod commands;
mod history;
mod output;
mod serve;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use courier::admin::{
    AdminError, AmqpAdmin, EmbeddedAdmin, HistoryAdmin, PostgresAdmin, QueueAdmin, SqliteAdmin, StoreAdmin,
};

use crate::args::{Cli, Command};
use crate::commands::{Connections, Failure, Run};
use crate::output::Out;

/// The exit codes a script can rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Done.
    Ok = 0,
    /// The operation failed (some messages of a batch, or a storage error).
    Failed = 1,
    /// Bad usage (clap's own code for a bad command line, too).
    Usage = 2,
    /// Not found: the queue, message or instance, or some of the messages given.
    NotFound = 3,
    /// Refused: not possible here (a file in use, an empty reason, a topic's DLQ, a
    /// database without Courier's tables).
    Refused = 4,
    /// The broker or database cannot be reached.
    Unavailable = 5,
    /// The operator did not confirm a change.
    NotConfirmed = 6,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

fn code_of(e: &AdminError) -> Exit {
    match e {
        AdminError::NotFound { .. } => Exit::NotFound,
        AdminError::Refused { .. } => Exit::Refused,
        AdminError::Unavailable { .. } => Exit::Unavailable,
        AdminError::Invalid { .. } => Exit::Usage,
        _ => Exit::Failed,
    }
}

/// Prints an error and its causes on standard error.
fn report(e: &AdminError) {
    let mut text = format!("error: {e}");
    for cause in courier_cli::causes(e) {
        text.push_str(&format!("\n  caused by: {cause}"));
    }
    if e.is_transient() {
        text.push_str("\n  (this can succeed if tried again)");
    }
    say!("{text}");
}

async fn connect(cli: &Cli) -> Result<Connections, AdminError> {
    let mut to = Connections {
        queues: None,
        store: None,
        history: None,
        embedded: None,
        rabbitmq: None,
    };
    if let Some(path) = &cli.target.embedded {
        let admin = EmbeddedAdmin::open(path).await?;
        let shared = Arc::new(admin.clone());
        to.queues = Some(shared.clone() as Arc<dyn QueueAdmin>);
        to.history = Some(shared.clone() as Arc<dyn HistoryAdmin>);
        to.store = Some(shared as Arc<dyn StoreAdmin>);
        to.embedded = Some(admin);
    }
    let mut schedules = None;
    if let Some(url) = &cli.target.postgres {
        let admin = Arc::new(PostgresAdmin::connect(url).await?);
        schedules = Some(courier::ScheduleStore::from(&*admin));
        // The Postgres transport's queues (none where it never ran), unless the queues
        // are the embedded broker's.
        if to.queues.is_none() {
            to.queues = Some(admin.clone() as Arc<dyn QueueAdmin>);
        }
        to.history = Some(admin.clone() as Arc<dyn HistoryAdmin>);
        to.store = Some(admin);
    }
    if let Some(path) = &cli.target.sqlite {
        let admin = SqliteAdmin::open(path).await?;
        schedules = Some(courier::ScheduleStore::from(&admin));
        let admin = Arc::new(admin);
        to.history = Some(admin.clone() as Arc<dyn HistoryAdmin>);
        to.store = Some(admin);
    }
    if let Some(url) = &cli.target.rabbitmq {
        let mut admin = AmqpAdmin::connect(url, schedules)
            .await?
            .with_queues(cli.target.rabbitmq_queue.iter().cloned());
        if let Some(management) = &cli.target.rabbitmq_management {
            admin = admin.with_management(management)?;
        }
        let admin = Arc::new(admin);
        to.queues = Some(admin.clone() as Arc<dyn QueueAdmin>);
        to.rabbitmq = Some(admin);
    }
    Ok(to)
}

async fn run(cli: Cli) -> Exit {
    if cli.target.embedded.is_none()
        && cli.target.postgres.is_none()
        && cli.target.sqlite.is_none()
        && cli.target.rabbitmq.is_none()
    {
        say!(
            "error: say what to connect to: --embedded FILE, --postgres URL, --sqlite FILE or --rabbitmq URL \
             (with --postgres URL or --sqlite FILE)"
        );
        return Exit::Usage;
    }
    if cli.target.rabbitmq_management.is_some() && cli.target.rabbitmq.is_none() {
        say!(
            "error: --rabbitmq-management (or COURIER_RABBITMQ_MANAGEMENT) needs --rabbitmq URL (or \
             COURIER_RABBITMQ): it reads the statistics of that broker's queues"
        );
        return Exit::Usage;
    }
    let to = match connect(&cli).await {
        Ok(to) => to,
        Err(e) => {
            report(&e);
            return code_of(&e);
        }
    };
    if let Command::Serve(args) = &cli.command {
        let exit = serve::serve(args, &to, cli.target.embedded.as_deref()).await;
        if let Some(e) = &to.embedded {
            e.close().await;
        }
        return exit;
    }
    let mut run = Run {
        json: cli.json,
        yes: cli.yes,
        to: &to,
        out: Out::default(),
    };
    let result = run.command(&cli.command).await;
    let out = std::mem::take(&mut run.out);
    out.print();
    if let Some(e) = &to.embedded {
        e.close().await;
    }
    if let Some(r) = &to.rabbitmq {
        r.close().await;
    }
    match result {
        Ok(exit) => exit,
        Err(Failure::Admin(e)) => {
            report(&e);
            code_of(&e)
        }
        Err(Failure::NotConfirmed) => Exit::NotConfirmed,
        Err(Failure::Usage(text)) => {
            say!("error: {text}");
            Exit::Usage
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // lapin logs each refused or dropped connection itself, at ERROR: the
                // command says what failed in its own error (RUST_LOG=lapin=warn shows them).
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lapin=off")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            say!("error: cannot start the runtime: {e}");
            return Exit::Failed.into();
        }
    };
    runtime.block_on(run(cli)).into()
}

/// [`say!`]'s writer: the line and a newline, errors ignored.
pub(crate) fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_fmt(line);
    let _ = stderr.write_all(b"\n");
}
