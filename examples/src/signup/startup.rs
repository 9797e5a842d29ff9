//! Long waits at start, told as they happen.
//!
//! A restart prints its first line within a few tenths of a second, unless a step before
//! it waits: for a server that refuses connections or does not answer (Postgres starting
//! or out of connections, RabbitMQ restarting: both are retried, for up to 30 s), for
//! another process applying the store's migrations, or, on RabbitMQ, for the parked
//! scenario while another connection holds it. Each step runs under [`Startup::step`]:
//! one still running after [`LONG_WAIT`] prints what it waits for and what can make it
//! wait, with the latest warning Courier logged meanwhile (its log is off by default),
//! and prints again when it is over. A program that says nothing is never left to guess at.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// How long a step may take before the program says it is waiting.
pub(crate) const LONG_WAIT: Duration = Duration::from_secs(1);

/// The latest warning Courier logged, whatever `RUST_LOG` says: a [`Layer`] for the
/// program's subscriber, and what [`Startup`] reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Warnings(Arc<Mutex<Option<String>>>);

impl Warnings {
    /// Takes the latest warning out.
    fn take(&self) -> Option<String> {
        self.0.lock().ok().and_then(|mut w| w.take())
    }
}

impl<S: Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || !meta.target().starts_with("courier") {
            return;
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        if let Ok(mut latest) = self.0.lock() {
            *latest = Some(text.0);
        }
    }
}

/// An event's fields in one line: the message, then `name=value` for the rest.
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let sep = if self.0.is_empty() { "" } else { ", " };
        let _ = if field.name() == "message" {
            write!(self.0, "{sep}{value:?}")
        } else {
            write!(self.0, "{sep}{}={value:?}", field.name())
        };
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }
}

/// A step of the start that can wait: what it waits for, and what can make it wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    what: &'static str,
    why: &'static str,
}

/// Connecting to Postgres (the store; on RabbitMQ, the scheduled messages too).
#[cfg(feature = "servers")]
pub(crate) const POSTGRES: Wait = Wait {
    what: "Postgres",
    why: "it refuses connections (starting up, or too many clients: a killed program's \
          connections count until Postgres sees they are gone); the pool tries again for up to 30 s",
};
/// Applying the store's migrations.
#[cfg(feature = "servers")]
pub(crate) const MIGRATIONS: Wait = Wait {
    what: "Courier's migrations",
    why: "another process is applying them to this database (they hold a lock while they run)",
};
/// Connecting to RabbitMQ.
#[cfg(any(feature = "servers", test))]
pub(crate) const RABBITMQ: Wait = Wait {
    what: "RabbitMQ",
    why: "it refuses or does not answer the connection (stopped, restarting, overloaded); the \
          transport tries again with backoff for up to 30 s",
};
/// Opening the embedded broker's file.
pub(crate) const BROKER_FILE: Wait = Wait {
    what: "the broker's file",
    why: "it is opened, migrated, and the locks a killed run left are released",
};
/// Reading the scenario parked by an earlier run.
pub(crate) const SCENARIO: Wait = Wait {
    what: "the parked scenario",
    why: "on RabbitMQ it is taken and put back (a queue cannot be browsed): a connection that \
          still holds it (a killed run's, until RabbitMQ sees it is gone) keeps it up to 1 s",
};
/// Starting the endpoints.
pub(crate) const ENDPOINTS: Wait = Wait {
    what: "the endpoints to start",
    why: "their queues and subscriptions are declared, and the broker is slow to answer \
          (or reconnecting)",
};

/// How often a step that still waits says so again.
const AGAIN_EVERY: Duration = Duration::from_secs(5);

/// Runs the steps of the start, and tells about the long ones.
#[derive(Debug)]
pub(crate) struct Startup {
    warnings: Warnings,
    /// The lines printed about long waits.
    said: Mutex<Vec<String>>,
}

impl Startup {
    pub(crate) fn new(warnings: Warnings) -> Self {
        Self {
            warnings,
            said: Mutex::new(Vec::new()),
        }
    }

    fn say(&self, line: String) {
        println!("{line}");
        if let Ok(mut said) = self.said.lock() {
            said.push(line);
        }
    }

    /// Runs `step`. Past [`LONG_WAIT`], prints what it waits for and what can make it
    /// wait, then every [`AGAIN_EVERY`] that it still waits, each time
    /// with Courier's latest warning, and at the end how long it took.
    pub(crate) async fn step<T>(&self, wait: Wait, step: impl Future<Output = T>) -> T {
        let Wait { what, why } = wait;
        let started = Instant::now();
        let _ = self.warnings.take(); // only those logged during this step
        let mut step = std::pin::pin!(step);
        let mut next = LONG_WAIT;
        let out = loop {
            tokio::select! {
                out = &mut step => break out,
                () = tokio::time::sleep_until(started + next) => {}
            }
            if next == LONG_WAIT {
                self.say(format!("waiting for {what} ({} s so far): {why}", next.as_secs()));
            } else {
                self.say(format!("  still waiting for {what} ({} s so far)", next.as_secs()));
            }
            if let Some(w) = self.warnings.take() {
                self.say(format!("  courier says: {w}"));
            }
            next += AGAIN_EVERY;
        };
        let took = started.elapsed();
        if took >= LONG_WAIT {
            self.say(format!("  ... {what}: waited {:.1} s", took.as_secs_f64()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::prelude::*;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_long_step_is_told_with_courier_s_warning() {
        let warnings = Warnings::default();
        let subscriber = tracing_subscriber::registry().with(warnings.clone());
        let _guard = tracing::subscriber::set_default(subscriber);
        let start = Startup::new(warnings);

        assert_eq!(start.step(RABBITMQ, async { 1 }).await, 1);
        assert!(start.said.lock().unwrap().is_empty(), "a quick step says nothing");

        let slow = async {
            tracing::warn!(target: "courier::amqp", error = "refused", "cannot connect");
            tracing::warn!(target: "lapin", "not courier's");
            tokio::time::sleep(Duration::from_millis(7500)).await;
            2
        };
        assert_eq!(start.step(RABBITMQ, slow).await, 2);
        let said = start.said.lock().unwrap().clone();
        assert_eq!(said.len(), 4, "{said:?}");
        assert!(
            said[0].starts_with("waiting for RabbitMQ (1 s so far): it refuses"),
            "{said:?}"
        );
        assert_eq!(said[1], "  courier says: cannot connect, error=refused");
        assert_eq!(said[2], "  still waiting for RabbitMQ (6 s so far)");
        assert_eq!(said[3], "  ... RabbitMQ: waited 7.5 s");
    }
}
