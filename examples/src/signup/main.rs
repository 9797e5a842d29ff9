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
//! message). The servers below need the example built with the feature `servers`
//! (`cargo run -p courier-examples --features servers --bin signup -- ...`); without it,
//! the URLs of the environment are ignored (it says so) and the flags are refused. With
//! `DATABASE_URL` set (or `--postgres URL`), the store is Postgres (schema
//! `courier`) and the broker stays embedded. With `AMQP_URL` set as well (or `--rabbitmq
//! URL`), the broker is RabbitMQ: queues and topics there, scheduled messages and sagas in
//! Postgres (RabbitMQ needs the Postgres store: it holds the scheduled messages). With
//! `--transport postgres` (or `COURIER_TRANSPORT=postgres`) and a Postgres URL, everything
//! lives in Postgres alone: queues, topics and scheduled messages in the Postgres transport,
//! sagas and inbox beside them, one Postgres transaction per message
//! (`PostgresTransport::store()`); a run killed with SIGKILL resumes as on the other
//! brokers (the killed run's message locks end when its connections go). Several runs
//! may share one database at once (start the others without `--fresh` once the first has
//! printed `new scenario`): they compete on the queues, and each hears every handler's
//! news, whichever process handled it, through a topic (`signup.News`, published in the
//! handler's transaction) that each run subscribes to with an endpoint of its own
//! (`signup-watch-<run>`, deleted at the end of the run; a run killed with SIGKILL leaves
//! it, and `--fresh` deletes the topic with it). On the other brokers the news goes to
//! the process's own `main` (`story::Newsroom`).
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
//! The folder: `workflow.rs` holds the workflow (the messages of `accounts` and `mailer`,
//! the `SignUp` and `Login` sagas, the mailer's handlers); `users.rs` the simulated users;
//! `story.rs` what the handlers tell `main`, and the time factor; `setup.rs` the transport
//! and store choices and the parked scenario; `watch.rs` and `audit.rs` the checks;
//! `startup.rs` the long waits at start; `metrics.rs` the metrics server. This file runs
//! the story.

#![allow(clippy::print_stdout)]

mod audit;
mod metrics;
mod setup;
mod startup;
mod story;
mod users;
mod watch;
mod workflow;

use std::error::Error;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use courier::prelude::*;
use startup::{Startup, Warnings};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing_subscriber::prelude::*;

use crate::audit::audit_done;
use crate::setup::{Scenario, find_scenario, open, routes};
use crate::story::{Heard, NewsNote, Newsroom, Timing, clock_text, hear, length_text};
use crate::users::{Arrive, CAST, Outcome, Persona};
use crate::watch::{Watch, print_stats};
use crate::workflow::{Login, SignUp, send_confirmation_mail, send_login_code};

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
  (--rabbitmq, --postgres and --transport need the build's feature `servers`)
  --rabbitmq URL   run on RabbitMQ instead of the embedded broker (default: $AMQP_URL if set;
                   needs --postgres or $DATABASE_URL)
  --postgres URL   keep sagas, inbox and timeouts in Postgres (default: $DATABASE_URL if set,
                   else the broker's own file)
  --transport postgres
                   run on Postgres alone: queues in the Postgres transport, one transaction
                   per message (default: $COURIER_TRANSPORT if set; needs --postgres or
                   $DATABASE_URL)
  --metrics ADDR   serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9000), and
                   keep serving after the story until Ctrl-C
  --keep-running   after the story, keep the endpoints running (receiving, dead-lettering,
                   firing timeouts) until Ctrl-C: for an operator to watch with `courier`";

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
    /// After the story, the endpoints keep running until Ctrl-C.
    keep_running: bool,
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
            keep_running: false,
        };
        // The flag that asked for a server, if one did (the environment's URLs only suggest).
        let mut servers_asked: Option<&str> = None;
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
                "--keep-running" => options.keep_running = true,
                "--postgres" => {
                    options.postgres = Some(value("--postgres")?);
                    servers_asked = Some("--postgres");
                }
                "--rabbitmq" => {
                    options.rabbitmq = Some(value("--rabbitmq")?);
                    servers_asked = Some("--rabbitmq");
                }
                "--transport" => {
                    options.transport = Some(value("--transport")?);
                    servers_asked = Some("--transport");
                }
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
        if !cfg!(feature = "servers") {
            if let Some(flag) = servers_asked {
                return Err(format!(
                    "{flag} needs the example built with its servers: \
                     cargo run -p courier-examples --features servers --bin signup -- ..."
                ));
            }
            if options.postgres.is_some() || options.rabbitmq.is_some() || options.transport.is_some() {
                println!(
                    "signup: DATABASE_URL, AMQP_URL or COURIER_TRANSPORT is set, but this build has no servers: \
                     running on the embedded broker (build with --features servers to use them)"
                );
                options.postgres = None;
                options.rabbitmq = None;
                options.transport = None;
            }
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
    // On the Postgres transport several runs may share the work: every handler's news
    // goes to every run, through a topic each run subscribes to with an endpoint of its
    // own, started before the others so that a fresh run hears all of its story.
    let broadcast = options.transport.is_some();
    let newsroom = if broadcast {
        Newsroom::Broadcast
    } else {
        Newsroom::Local(news_tx.clone())
    };
    let watch_name = format!(
        "signup-watch-{:x}-{}",
        Utc::now().timestamp_millis(),
        std::process::id()
    );
    // Every endpoint keeps a history (`courier history`, docs/history.md) with the
    // messages' bodies, so that a user can be found from their e-mail address; the
    // two-factor codes are never stored in it.
    let endpoint = |name: &str| {
        Endpoint::builder(name)
            .transport(transport.clone())
            .store(store.clone())
            .routes(routes())
            .state(newsroom.clone())
            .state(timing)
            .shutdown_timeout(SHUTDOWN_TIMEOUT)
            .history(HistoryOptions::new().with_bodies(true).redact(["code"]))
    };
    let endpoints = async {
        let watcher = if broadcast {
            let watcher = Endpoint::builder(watch_name.as_str())
                .transport(transport.clone())
                .routes(routes())
                .state(Heard(news_tx.clone()))
                .concurrency(1)
                .prefetch(1)
                .shutdown_timeout(SHUTDOWN_TIMEOUT)
                .handler(hear)
                .start()
                .await?;
            Some(watcher)
        } else {
            None
        };
        // `users` and `mailer` send to queues the endpoints started after them create: the
        // check of their routes at start would warn of queues about to exist.
        let users = endpoint("users")
            .check_routes_at_start(false)
            .saga::<Persona>()
            .handler(audit_done)
            .start()
            .await?;
        let mailer = endpoint("mailer")
            .check_routes_at_start(false)
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
        Ok::<_, courier::Error>((watcher, users, mailer, accounts))
    };
    let (watcher, users, mailer, accounts) = start.step(startup::ENDPOINTS, endpoints).await?;

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
    if options.keep_running && story.is_some() {
        println!(
            "--keep-running: the endpoints users, mailer and accounts keep running (see docs/operations.md); \
             Ctrl-C stops them"
        );
        ctrl_c_pressed(&mut ctrl_c).await;
    }
    let mut reports = Vec::new();
    for e in [accounts, mailer, users] {
        let stats = e.stats();
        let name = e.name().to_owned();
        reports.push((name, stats, e.shutdown().await?));
    }
    if let Some(watcher) = watcher {
        // The news this run heard is in; its subscription and queue go (a run killed
        // with SIGKILL leaves them: `--fresh` deletes the topic with its subscriptions).
        watcher.shutdown().await?;
        if let Some(topic) = routes().topic_of(<NewsNote as Message>::NAME) {
            transport
                .delete(&EntityPath::subscription(topic, watch_name.as_str()))
                .await?;
        }
        transport.delete(&EntityPath::queue(watch_name.as_str())).await?;
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
