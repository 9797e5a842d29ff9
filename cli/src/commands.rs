//! The commands: each reads through `courier::admin`, prints a table or JSON, and for a
//! change shows what it would do (`--dry-run`) or asks before doing it (unless `--yes`).

use std::sync::Arc;

use courier::admin::{
    AdminError, AmqpAdmin, BodyView, DeadLetter, EmbeddedAdmin, HistoryAdmin, QueueAdmin, SagaFilter, SagaInstance,
    StoreAdmin, TimeoutFilter, TimeoutState,
};
use serde_json::json;

use crate::Exit;
use crate::args::{Change, Command, DlqCommand, OutboxArgs, SagaCommand, TimeoutArgs};
use crate::output::{Out, age, block, cell, opt, since, time};

/// Why a command stopped.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The operations API said no.
    Admin(AdminError),
    /// The operator did not confirm.
    NotConfirmed,
    /// The command needs a connection that was not given.
    Usage(String),
}

impl From<AdminError> for Failure {
    fn from(e: AdminError) -> Self {
        Failure::Admin(e)
    }
}

/// What the command is connected to.
pub(crate) struct Connections {
    pub(crate) queues: Option<Arc<dyn QueueAdmin>>,
    pub(crate) store: Option<Arc<dyn StoreAdmin>>,
    /// The store's history (the same store).
    pub(crate) history: Option<Arc<dyn HistoryAdmin>>,
    pub(crate) embedded: Option<EmbeddedAdmin>,
    /// RabbitMQ, when given (its connection is closed at the end).
    pub(crate) rabbitmq: Option<Arc<AmqpAdmin>>,
}

/// How a command runs: output format and confirmation.
pub(crate) struct Run<'a> {
    pub(crate) json: bool,
    pub(crate) yes: bool,
    pub(crate) to: &'a Connections,
    pub(crate) out: Out,
}

impl Run<'_> {
    fn queues(&self) -> Result<&dyn QueueAdmin, Failure> {
        self.to.queues.as_deref().ok_or_else(|| {
            Failure::Usage(
                "queue commands need a broker: --embedded FILE, --postgres URL (the Postgres transport) or \
                 --rabbitmq URL"
                    .into(),
            )
        })
    }

    fn store(&self) -> Result<&dyn StoreAdmin, Failure> {
        self.to.store.as_deref().ok_or_else(|| {
            Failure::Usage(
                "saga, timeout and outbox commands need a store: --embedded FILE, --postgres URL or --sqlite FILE"
                    .into(),
            )
        })
    }

    /// Refuses a change at once on a broker file another process runs (before asking).
    fn check_writable(&self) -> Result<(), Failure> {
        match &self.to.embedded {
            Some(e) if e.is_read_only() => Err(Failure::Admin(AdminError::Refused {
                reason: "the broker's file is in use by a running process, so it is open read-only: stop that \
                         process first, or run the operation inside it (courier::admin::EmbeddedAdmin::new)"
                    .into(),
            })),
            _ => Ok(()),
        }
    }

    /// Asks on the terminal unless `--yes`; `false` unless the answer is yes.
    fn confirm(&self, question: &str) -> Result<(), Failure> {
        if self.yes {
            return Ok(());
        }
        eprint!("{question} [y/N] ");
        let mut answer = String::new();
        match std::io::stdin().read_line(&mut answer) {
            Ok(_) if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") => Ok(()),
            _ => {
                say!("not confirmed: nothing changed (pass --yes to skip the question)");
                Err(Failure::NotConfirmed)
            }
        }
    }

    pub(crate) async fn command(&mut self, command: &Command) -> Result<Exit, Failure> {
        match command {
            Command::Queues => self.list_queues().await,
            Command::DeadLetters(DlqCommand::List { queue, after, limit }) => {
                self.list_dead_letters(queue, *after, *limit).await
            }
            Command::DeadLetters(DlqCommand::Show {
                queue,
                sequence_number,
                full,
            }) => self.show_dead_letter(queue, *sequence_number, *full).await,
            Command::DeadLetters(DlqCommand::Resubmit(change)) => self.change(change, true).await,
            Command::DeadLetters(DlqCommand::Delete(change)) => self.change(change, false).await,
            Command::Sagas(cmd) => self.sagas(cmd).await,
            Command::Timeouts(args) => self.timeouts(args).await,
            Command::Outbox(args) => self.outbox(args).await,
            Command::History(cmd) => self.history(cmd).await,
            // Started by main (serve.rs): it serves until Ctrl-C rather than printing.
            Command::Serve(_) => Err(Failure::Usage("`serve` is not a printing command".into())),
        }
    }

    async fn list_queues(&mut self) -> Result<Exit, Failure> {
        let admin = self.queues()?;
        let queues = admin.queues().await?;
        if self.json {
            self.out.json(&queues);
            return Ok(Exit::Ok);
        }
        let now = admin.now();
        let rows: Vec<Vec<String>> = queues
            .iter()
            .map(|q| {
                vec![
                    q.name.clone(),
                    format!("{:?}", q.kind).to_lowercase(),
                    q.active.to_string(),
                    q.locked.to_string(),
                    q.scheduled.to_string(),
                    q.deferred.to_string(),
                    q.dead_lettered.to_string(),
                    q.oldest_age(now).map_or_else(|| "-".into(), age),
                ]
            })
            .collect();
        self.out.table(
            &[
                "NAME",
                "KIND",
                "ACTIVE",
                "LOCKED",
                "SCHEDULED",
                "DEFERRED",
                "DEAD",
                "OLDEST",
            ],
            &rows,
        );
        Ok(Exit::Ok)
    }

    async fn list_dead_letters(&mut self, queue: &str, after: i64, limit: u32) -> Result<Exit, Failure> {
        let admin = self.queues()?;
        let page = admin.dead_letters(queue, after, limit).await?;
        if self.json {
            self.out.json(&page);
            return Ok(Exit::Ok);
        }
        let now = admin.now();
        let rows: Vec<Vec<String>> = page
            .items
            .iter()
            .map(|d| {
                vec![
                    d.sequence_number.to_string(),
                    cell(&d.message_id, 40),
                    opt(d.message_type.as_deref(), 30),
                    since(d.enqueued_at, now),
                    d.delivery_count.to_string(),
                    opt(d.reason.as_deref(), 30),
                    opt(d.error.as_deref(), 60),
                ]
            })
            .collect();
        self.out.table(
            &["SEQ", "MESSAGE ID", "TYPE", "ENQUEUED", "DELIVERIES", "REASON", "ERROR"],
            &rows,
        );
        self.out.line(format!(
            "{} of {} dead letters of {queue}",
            page.items.len(),
            page.total
        ));
        if let Some(next) = page.next_after {
            self.out.line(format!(
                "next page: courier dlq list {queue} --after {next} --limit {limit}"
            ));
        }
        Ok(Exit::Ok)
    }

    async fn show_dead_letter(&mut self, queue: &str, seq: i64, full: bool) -> Result<Exit, Failure> {
        let admin = self.queues()?;
        let d = admin.dead_letter(queue, seq).await?;
        if self.json {
            self.out.json(&d);
        } else {
            let now = admin.now();
            show(&mut self.out, &d, now, full);
        }
        Ok(Exit::Ok)
    }

    async fn change(&mut self, change: &Change, resubmit: bool) -> Result<Exit, Failure> {
        let admin = self.queues()?;
        let queue = change.queue.as_str();
        let seqs = if change.all {
            admin.all_dead_letters(queue).await?
        } else {
            change.sequence_numbers.clone()
        };
        let verb = if resubmit { "resubmit" } else { "delete" };
        if change.dry_run {
            // What is there now (on RabbitMQ one reading of the dead-letter queue, which
            // moves nothing).
            let (found, missing) = admin.dead_letter_summaries(queue, &seqs).await?;
            // A resubmit some dead letters cannot take (on RabbitMQ, one of a session
            // queue without a session id) says so, as the resubmit itself would.
            fn refusal(d: &courier::admin::DeadLetterSummary, resubmit: bool) -> Option<&str> {
                d.resubmit_refused.as_deref().filter(|_| resubmit)
            }
            let refused = |d| refusal(d, resubmit);
            if self.json {
                let (seqs, would_fail): (Vec<_>, Vec<_>) = found.iter().partition(|d| refused(d).is_none());
                let seqs: Vec<i64> = seqs.iter().map(|d| d.sequence_number).collect();
                let would_fail: Vec<_> = would_fail
                    .iter()
                    .map(|d| json!({"sequence_number": d.sequence_number, "reason": refused(d)}))
                    .collect();
                self.out.json(&json!({
                    "dry_run": true, "action": verb, "queue": queue,
                    "sequence_numbers": seqs, "not_found": missing, "would_fail": would_fail,
                }));
            } else {
                for d in &found {
                    match refused(d) {
                        Some(why) => self.out.line(format!(
                            "would fail {} ({}): {}",
                            d.sequence_number,
                            cell(&d.message_id, 40),
                            cell(why, 2000)
                        )),
                        None => self.out.line(format!(
                            "would {verb} {} ({}, {})",
                            d.sequence_number,
                            cell(&d.message_id, 40),
                            opt(d.reason.as_deref(), 40)
                        )),
                    }
                }
                for seq in &missing {
                    self.out.line(format!("not found: {seq}"));
                }
                self.out.line(format!(
                    "dry run: {} dead letters of {queue}, nothing changed",
                    found.len()
                ));
            }
            // The exit the change would have: failures first, as the change reports them.
            return Ok(if found.iter().any(|d| refused(d).is_some()) {
                Exit::Failed
            } else if missing.is_empty() {
                Exit::Ok
            } else {
                Exit::NotFound
            });
        }
        if seqs.is_empty() {
            if self.json {
                self.out.json(&courier::admin::BatchOutcome::default());
            } else {
                self.out.line(format!("{queue} has no dead letters: nothing to do"));
            }
            return Ok(Exit::Ok);
        }
        self.check_writable()?;
        // Ask about what is there: numbers given that are not dead letters of the queue
        // are reported, not counted (on RabbitMQ a reading, which moves nothing).
        let (seqs, missing) = if change.all {
            (seqs, Vec::new())
        } else {
            let (found, missing) = admin.dead_letter_summaries(queue, &seqs).await?;
            (found.iter().map(|d| d.sequence_number).collect::<Vec<_>>(), missing)
        };
        if seqs.is_empty() {
            if self.json {
                let mut outcome = courier::admin::BatchOutcome::default();
                outcome.not_found = missing;
                self.out.json(&outcome);
            } else {
                self.out.line(format!("not found: {missing:?} (nothing changed)"));
            }
            return Ok(Exit::NotFound);
        }
        let target = if resubmit {
            format!(" back to {queue}")
        } else {
            " for good".into()
        };
        let left_out = if missing.is_empty() {
            String::new()
        } else {
            format!(" (not found, left out: {missing:?})")
        };
        self.confirm(&format!(
            "{} {} dead letter(s) of {queue}{target}{left_out}?",
            if resubmit { "Resubmit" } else { "Delete" },
            seqs.len()
        ))?;
        let mut outcome = if resubmit {
            admin.resubmit_many(queue, &seqs).await?
        } else {
            admin.delete_many(queue, &seqs).await?
        };
        outcome.not_found.extend(missing);
        outcome.not_found.sort_unstable();
        if self.json {
            self.out.json(&outcome);
        } else {
            let done = if resubmit { "resubmitted" } else { "deleted" };
            self.out
                .line(format!("{done} {} dead letter(s) of {queue}", outcome.done.len()));
            if !outcome.not_found.is_empty() {
                self.out.line(format!("not found: {:?}", outcome.not_found));
            }
            for (seq, why) in &outcome.failed {
                self.out
                    .line(format!("failed {seq} (left in the dead-letter queue): {why}"));
            }
        }
        Ok(if !outcome.failed.is_empty() {
            Exit::Failed
        } else if !outcome.not_found.is_empty() {
            Exit::NotFound
        } else {
            Exit::Ok
        })
    }

    async fn sagas(&mut self, cmd: &SagaCommand) -> Result<Exit, Failure> {
        let admin = self.store()?;
        let now = admin.now();
        match cmd {
            SagaCommand::Types => {
                let types = admin.saga_types().await?;
                if self.json {
                    self.out.json(&types);
                } else {
                    let rows: Vec<Vec<String>> = types
                        .iter()
                        .map(|t| {
                            vec![
                                t.saga_type.clone(),
                                t.instances.to_string(),
                                t.oldest_updated_at.map_or_else(|| "-".into(), |u| since(u, now)),
                            ]
                        })
                        .collect();
                    self.out.table(&["SAGA", "INSTANCES", "LEAST RECENT UPDATE"], &rows);
                }
            }
            SagaCommand::List {
                saga,
                correlation,
                older_than,
                with_timeout,
                without_timeout,
                limit,
            } => {
                let mut filter = SagaFilter::default().limit(*limit);
                if let Some(c) = correlation {
                    filter = filter.correlation(c.clone());
                }
                if let Some(d) = older_than {
                    filter = filter.updated_before(now - *d);
                }
                if *with_timeout || *without_timeout {
                    filter = filter.has_pending_timeout(*with_timeout);
                }
                let list = admin.sagas(saga, &filter).await?;
                if self.json {
                    self.out.json(&list);
                } else {
                    let rows: Vec<Vec<String>> = list
                        .iter()
                        .map(|s| {
                            vec![
                                cell(&s.correlation, 60),
                                s.version.to_string(),
                                since(s.created_at, now),
                                since(s.updated_at, now),
                                s.pending_timeouts.to_string(),
                            ]
                        })
                        .collect();
                    self.out
                        .table(&["CORRELATION", "VERSION", "CREATED", "UPDATED", "TIMEOUTS"], &rows);
                }
            }
            SagaCommand::Show { saga, correlation } => {
                let instance = admin.saga(saga, correlation).await?;
                if self.json {
                    self.out.json(&instance);
                } else {
                    show_saga(&mut self.out, &instance, now);
                }
            }
            SagaCommand::Complete {
                saga,
                correlation,
                reason,
                dry_run,
            } => {
                let instance = admin.saga(saga, correlation).await?;
                if *dry_run {
                    if self.json {
                        self.out
                            .json(&json!({"dry_run": true, "action": "complete", "instance": instance}));
                    } else {
                        show_saga(&mut self.out, &instance, now);
                        self.out.line(format!(
                            "dry run: would complete saga {saga} instance {} and remove {} timeout(s); nothing changed",
                            cell(correlation, 60),
                            instance.timeouts.len()
                        ));
                    }
                    return Ok(Exit::Ok);
                }
                self.check_writable()?;
                self.confirm(&format!(
                    "Complete saga {saga} instance {} (version {}) and remove its {} timeout(s)?",
                    cell(correlation, 60),
                    instance.summary.version,
                    instance.timeouts.len()
                ))?;
                let done = admin.complete_saga(saga, correlation, reason).await?;
                if self.json {
                    self.out.json(&done);
                } else {
                    self.out.line(format!(
                        "completed saga {saga} instance {} (version {}); removed {} timeout(s)",
                        cell(correlation, 60),
                        done.version,
                        done.timeouts_removed
                    ));
                }
            }
        }
        Ok(Exit::Ok)
    }

    async fn timeouts(&mut self, args: &TimeoutArgs) -> Result<Exit, Failure> {
        let admin = self.store()?;
        let mut filter = TimeoutFilter::default().limit(args.limit);
        filter.grace = args.grace;
        if args.overdue {
            filter = filter.overdue();
        }
        let list = admin.timeouts(&filter).await?;
        if self.json {
            self.out.json(&list);
            return Ok(Exit::Ok);
        }
        let now = admin.now();
        self.out.table(
            &["ID", "SAGA", "CORRELATION", "KEY", "DUE", "STATE", "ENDPOINT"],
            &timeout_rows(&list, now),
        );
        Ok(Exit::Ok)
    }

    async fn outbox(&mut self, args: &OutboxArgs) -> Result<Exit, Failure> {
        let admin = self.store()?;
        let list = if args.dead {
            admin.outbox_dead_letters(args.limit).await?
        } else {
            admin.outbox(args.limit).await?
        };
        if self.json {
            self.out.json(&list);
            return Ok(Exit::Ok);
        }
        let now = admin.now();
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|o| {
                let mut row = vec![
                    o.id.to_string(),
                    cell(&o.endpoint, 30),
                    format!("{}{}", if o.is_topic { "topic " } else { "" }, cell(&o.destination, 40)),
                    opt(o.message_id.as_deref(), 40),
                    opt(o.message_type.as_deref(), 30),
                    age(now - o.created_at),
                ];
                if args.dead {
                    row.push(opt(o.dead_letter_reason.as_deref(), 30));
                    row.push(opt(o.dead_letter_description.as_deref(), 60));
                }
                row
            })
            .collect();
        let mut headers = vec!["ID", "ENDPOINT", "DESTINATION", "MESSAGE ID", "TYPE", "AGE"];
        if args.dead {
            headers.extend(["REASON", "DESCRIPTION"]);
        }
        self.out.table(&headers, &rows);
        Ok(Exit::Ok)
    }
}

fn timeout_rows(list: &[courier::admin::PendingTimeout], now: chrono::DateTime<chrono::Utc>) -> Vec<Vec<String>> {
    list.iter()
        .map(|t| {
            vec![
                cell(&t.id, 40),
                cell(&t.saga_type, 30),
                cell(&t.correlation, 40),
                opt(t.key.as_deref(), 30),
                since(t.due_at, now),
                match t.state {
                    TimeoutState::Waiting => "waiting".into(),
                    TimeoutState::Dispatched => "sent".into(),
                    TimeoutState::DeadLettered => {
                        format!("dead-lettered ({})", opt(t.dead_letter_reason.as_deref(), 30))
                    }
                    _ => "other".into(),
                },
                cell(&t.endpoint, 30),
            ]
        })
        .collect()
}

/// How many characters of a body or error text `dlq show` prints without `--full`.
const SHOWN: usize = 4096;

/// `text` as `dlq show` prints it: whole with `--full`, else its first [`SHOWN`]
/// characters and how much more there is.
fn cut(text: &str, full: bool) -> String {
    if full || text.chars().count() <= SHOWN {
        return text.to_owned();
    }
    let head: String = text.chars().take(SHOWN).collect();
    format!(
        "{head}\n… cut after {SHOWN} of {} characters: --full prints all of it, --json gives the data",
        text.chars().count()
    )
}

fn show(out: &mut Out, d: &DeadLetter, now: chrono::DateTime<chrono::Utc>, full: bool) {
    let field = |out: &mut Out, name: &str, value: String| out.line(format!("{name:<15} {value}"));
    field(out, "queue:", cell(&d.queue, 200));
    field(out, "sequence:", d.sequence_number.to_string());
    field(out, "message id:", cell(&d.message_id, 200));
    field(out, "type:", opt(d.message_type.as_deref(), 200));
    field(out, "correlation:", opt(d.correlation_id.as_deref(), 200));
    field(out, "causation:", opt(d.causation_id.as_deref(), 200));
    field(out, "session:", opt(d.session_id.as_deref(), 200));
    field(out, "content type:", opt(d.content_type.as_deref(), 200));
    field(
        out,
        "enqueued:",
        format!("{} ({})", time(d.enqueued_at), since(d.enqueued_at, now)),
    );
    field(out, "deliveries:", d.delivery_count.to_string());
    field(out, "reason:", opt(d.reason.as_deref(), 200));
    field(out, "description:", opt(d.description.as_deref(), 2000));
    field(out, "source:", opt(d.source.as_deref(), 200));
    if let Some(why) = &d.resubmit_refused {
        field(out, "resubmit:", format!("refused: {}", cell(why, 2000)));
    }
    if let Some(e) = &d.error {
        out.line("error:");
        out.line(indent(&block(&cut(e, full))));
    }
    if let Some(chain) = &d.error_chain {
        out.line("error chain:");
        out.line(indent(&block(&cut(chain, full))));
    }
    out.line("headers:");
    for (k, v) in &d.headers {
        let value = serde_json::to_string(v).unwrap_or_default();
        out.line(format!("  {} = {}", cell(k, 100), cell(&value, 500)));
    }
    match &d.body {
        BodyView::Json(v) => {
            out.line(format!("body (JSON, {} bytes):", d.body_size));
            let text = serde_json::to_string_pretty(v).unwrap_or_default();
            out.line(indent(&block(&cut(&text, full))));
        }
        BodyView::Text(t) => {
            out.line(format!("body (text, {} bytes):", d.body_size));
            out.line(indent(&block(&cut(t, full))));
        }
        BodyView::Bytes(b) => {
            out.line(format!("body ({} bytes):", d.body_size));
            let shown = if full { b.len() } else { 256 };
            for row in b[..b.len().min(shown)].chunks(32) {
                let hex: Vec<String> = row.iter().map(|x| format!("{x:02x}")).collect();
                out.line(format!("  {}", hex.join(" ")));
            }
            if b.len() > shown {
                out.line(format!(
                    "  … cut after {shown} of {} bytes: --full prints all of them",
                    b.len()
                ));
            }
        }
        _ => out.line("body: (not shown)"),
    }
}

fn show_saga(out: &mut Out, s: &SagaInstance, now: chrono::DateTime<chrono::Utc>) {
    let field = |out: &mut Out, name: &str, value: String| out.line(format!("{name:<15} {value}"));
    field(out, "saga:", cell(&s.summary.saga_type, 200));
    field(out, "correlation:", cell(&s.summary.correlation, 200));
    field(out, "version:", s.summary.version.to_string());
    field(out, "state version:", s.state_version.to_string());
    field(
        out,
        "created:",
        format!("{} ({})", time(s.summary.created_at), since(s.summary.created_at, now)),
    );
    field(
        out,
        "updated:",
        format!("{} ({})", time(s.summary.updated_at), since(s.summary.updated_at, now)),
    );
    out.line("state:");
    out.line(indent(&block(
        &serde_json::to_string_pretty(&s.state).unwrap_or_default(),
    )));
    if s.timeouts.is_empty() {
        out.line("timeouts:      none pending");
    } else {
        out.line("timeouts:");
        out.table(
            &["ID", "SAGA", "CORRELATION", "KEY", "DUE", "STATE", "ENDPOINT"],
            &timeout_rows(&s.timeouts, now),
        );
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}
