//! An embedded broker's file as `courier serve` shows it: without holding the file, so
//! the application can start while the console serves. Its queues, its store and its
//! workflow history are read alike.
//!
//! The embedded broker takes a lock file (`<file>.lock`) for as long as it runs: a second
//! broker on the file, the application's, fails to open ("its lock file is held"). So
//! [`EmbeddedFile`] reads through read-only connections that take no lock
//! ([`EmbeddedAdmin::open_read_only`]), and opens the broker only for a change (a
//! resubmit, a delete, a saga completed by hand), closing it as soon as the change is
//! done. While the application runs, it holds the lock, and the console is read-only: its
//! pages say so in a banner ([`read_only_reason`](EmbeddedFile::read_only_reason)), and a
//! change answers "Refused" (409).
//!
//! An application started during a change (which holds the file for as long as it takes:
//! a resubmit of every dead letter of a large queue can take seconds) fails to open as
//! when a `courier dlq` command runs, and can be started again.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use courier::SequenceNumber;
use courier::admin::{
    AdminError, AdminResult, BatchOutcome, CompletedSaga, DeadLetter, DeadLetterSummary, EmbeddedAdmin, HistoryAdmin,
    HistoryFilter, MessageHistory, OutboxEntry, Page, PendingTimeout, QueueAdmin, QueueSummary, SagaFilter,
    SagaHistory, SagaInstance, SagaSummary, SagaTypeSummary, StoreAdmin, TimeoutFilter,
};

/// What a change on a file the application holds is told (and what the banner says).
fn in_use_text(path: &Path) -> String {
    format!(
        "the broker file {} is in use by a running application, so the console is read-only: it shows the \
         file as it is, and refuses resubmits, deletes and completions. Stop the application to change it \
         here, or serve the console inside the application (courier_cli::console::Console over \
         EmbeddedAdmin::new(broker))",
        path.display()
    )
}

/// An embedded broker's file, read without its lock and opened as the broker only for
/// each change (see the module documentation).
#[derive(Debug, Clone)]
pub struct EmbeddedFile {
    path: PathBuf,
    reads: EmbeddedAdmin,
    /// One change at a time (two would compete for the file's lock).
    changes: Arc<tokio::sync::Mutex<()>>,
}

impl EmbeddedFile {
    /// Opens an existing broker file for reading, without taking its lock.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if there is no such file; [`AdminError::Unavailable`] if
    /// it cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> AdminResult<Self> {
        let path = path.as_ref().to_path_buf();
        let reads = EmbeddedAdmin::open_read_only(&path).await?;
        Ok(Self {
            path,
            reads,
            changes: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the console is read-only now (an application runs the file), or `None` when a
    /// change can open it (no one holds its lock, or this console does, for a change).
    pub fn read_only_reason(&self) -> Option<String> {
        if self.changes.try_lock().is_err() {
            // A change of this console's is under way: the lock is its own.
            return None;
        }
        EmbeddedAdmin::is_in_use(&self.path).then(|| in_use_text(&self.path))
    }

    /// Runs `change` on the broker opened for it, then closes the broker. The work runs
    /// on a thread (and runtime) of its own: a browser that goes away meanwhile does not
    /// cut it short, the file is released when it ends, and opening a broker (whose
    /// migrations' future the compiler cannot show to be `Send`) needs no `Send` future.
    async fn change<T, F, Fut>(&self, change: F) -> AdminResult<T>
    where
        T: Send + 'static,
        F: FnOnce(EmbeddedAdmin) -> Fut + Send + 'static,
        Fut: Future<Output = AdminResult<T>>,
    {
        let path = self.path.clone();
        let one_at_a_time = self.changes.clone().lock_owned().await;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let work = move || {
            let _held = one_at_a_time;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let done = match runtime {
                Ok(runtime) => runtime.block_on(async move {
                    let admin = match EmbeddedAdmin::open(&path).await {
                        Ok(a) => a,
                        // The application opened it between the check and the open.
                        Err(AdminError::Unavailable { .. }) if EmbeddedAdmin::is_in_use(&path) => {
                            return Err(AdminError::Refused {
                                reason: in_use_text(&path),
                            });
                        }
                        Err(e) => return Err(e),
                    };
                    if admin.is_read_only() {
                        return Err(AdminError::Refused {
                            reason: in_use_text(&path),
                        });
                    }
                    let done = change(admin.clone()).await;
                    admin.close().await;
                    done
                }),
                Err(e) => Err(stopped(&path, &e.to_string())),
            };
            let _ = reply.send(done);
        };
        if let Err(e) = std::thread::Builder::new()
            .name("courier-console-change".into())
            .spawn(work)
        {
            return Err(stopped(&self.path, &e.to_string()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(stopped(&self.path, "its thread ended without an answer")))
    }
}

/// A change that could not run or stopped before it ended.
fn stopped(path: &Path, why: &str) -> AdminError {
    AdminError::Failed(Box::new(courier::Error::new(courier::ErrorKind::Storage {
        detail: format!(
            "the change on {} could not run to its end ({why}): each message is either changed or as it was; look \
             at the list again",
            path.display()
        ),
        transient: true,
    })))
}

#[async_trait]
impl QueueAdmin for EmbeddedFile {
    fn describe(&self) -> String {
        QueueAdmin::describe(&self.reads)
    }

    fn now(&self) -> DateTime<Utc> {
        QueueAdmin::now(&self.reads)
    }

    async fn queues(&self) -> AdminResult<Vec<QueueSummary>> {
        self.reads.queues().await
    }

    async fn dead_letters(
        &self,
        queue: &str,
        after: SequenceNumber,
        limit: u32,
    ) -> AdminResult<Page<DeadLetterSummary>> {
        self.reads.dead_letters(queue, after, limit).await
    }

    async fn dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<DeadLetter> {
        self.reads.dead_letter(queue, sequence_number).await
    }

    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let queue = queue.to_owned();
        self.change(move |a| async move { a.resubmit(&queue, sequence_number).await })
            .await
    }

    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let queue = queue.to_owned();
        self.change(move |a| async move { a.delete_dead_letter(&queue, sequence_number).await })
            .await
    }

    async fn resubmit_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let (queue, seqs) = (queue.to_owned(), sequence_numbers.to_vec());
        self.change(move |a| async move { a.resubmit_many(&queue, &seqs).await })
            .await
    }

    async fn delete_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let (queue, seqs) = (queue.to_owned(), sequence_numbers.to_vec());
        self.change(move |a| async move { a.delete_many(&queue, &seqs).await })
            .await
    }

    async fn all_dead_letters(&self, queue: &str) -> AdminResult<Vec<SequenceNumber>> {
        self.reads.all_dead_letters(queue).await
    }
}

#[async_trait]
impl StoreAdmin for EmbeddedFile {
    fn describe(&self) -> String {
        StoreAdmin::describe(&self.reads)
    }

    fn now(&self) -> DateTime<Utc> {
        StoreAdmin::now(&self.reads)
    }

    async fn saga_types(&self) -> AdminResult<Vec<SagaTypeSummary>> {
        self.reads.saga_types().await
    }

    async fn sagas(&self, saga_type: &str, filter: &SagaFilter) -> AdminResult<Vec<SagaSummary>> {
        self.reads.sagas(saga_type, filter).await
    }

    async fn saga(&self, saga_type: &str, correlation: &str) -> AdminResult<SagaInstance> {
        self.reads.saga(saga_type, correlation).await
    }

    async fn complete_saga(&self, saga_type: &str, correlation: &str, reason: &str) -> AdminResult<CompletedSaga> {
        let (saga_type, correlation, reason) = (saga_type.to_owned(), correlation.to_owned(), reason.to_owned());
        self.change(move |a| async move { a.complete_saga(&saga_type, &correlation, &reason).await })
            .await
    }

    async fn timeouts(&self, filter: &TimeoutFilter) -> AdminResult<Vec<PendingTimeout>> {
        self.reads.timeouts(filter).await
    }

    async fn outbox(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        self.reads.outbox(limit).await
    }

    async fn outbox_dead_letters(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        self.reads.outbox_dead_letters(limit).await
    }
}

/// The history is only read: through the read-only connections, as the other pages.
#[async_trait]
impl HistoryAdmin for EmbeddedFile {
    fn describe(&self) -> String {
        HistoryAdmin::describe(&self.reads)
    }

    async fn saga_history(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
    ) -> AdminResult<SagaHistory> {
        self.reads.saga_history(saga_type, correlation, filter).await
    }

    async fn message_history(&self, message_id: &str, filter: &HistoryFilter) -> AdminResult<MessageHistory> {
        self.reads.message_history(message_id, filter).await
    }

    async fn find(&self, text: &str, filter: &HistoryFilter) -> AdminResult<courier::admin::FoundHistory> {
        self.reads.find(text, filter).await
    }
}
