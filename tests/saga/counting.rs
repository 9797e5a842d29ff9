//! `CountingClaims`: a store that wraps another, counts the timeout dispatcher's claims
//! and can lose the replies of the first ones, for the timeout tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A store that counts the dispatcher's claims, and can lose the replies of the first
/// ones (the claim commits, the dispatcher sees an error: a connection that dropped).
pub(crate) struct CountingClaims {
    pub(crate) inner: Arc<dyn courier::Store>,
    pub(crate) claims: AtomicU32,
    /// How many claim replies are still to be lost.
    pub(crate) lose_replies: AtomicU32,
}

#[async_trait::async_trait]
impl courier::Store for CountingClaims {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn migrate(&self) -> courier::Result<()> {
        self.inner.migrate().await
    }
    fn unit_of_work_scope(&self, transport: &dyn courier::Transport) -> courier::UnitOfWorkScope {
        self.inner.unit_of_work_scope(transport)
    }
    async fn schedule_retry(
        &self,
        endpoint: &str,
        lock: courier::LockToken,
        copy: courier::Envelope,
        timeout: Option<&str>,
        due: chrono::DateTime<chrono::Utc>,
    ) -> courier::Result<bool> {
        self.inner.schedule_retry(endpoint, lock, copy, timeout, due).await
    }
    async fn begin(
        &self,
        endpoint: &str,
        message_id: &str,
        lock: Option<courier::LockToken>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> courier::Result<courier::Begin> {
        self.inner.begin(endpoint, message_id, lock, now).await
    }
    async fn mark_dispatched(&self, ids: &[i64]) -> courier::Result<()> {
        self.inner.mark_dispatched(ids).await
    }
    async fn undispatched(
        &self,
        endpoint: &str,
        older_than: chrono::DateTime<chrono::Utc>,
        limit: i64,
    ) -> courier::Result<Vec<courier::OutboxMessage>> {
        self.inner.undispatched(endpoint, older_than, limit).await
    }
    async fn purge_inbox(
        &self,
        endpoint: &str,
        before: chrono::DateTime<chrono::Utc>,
        limit: i64,
    ) -> courier::Result<u64> {
        self.inner.purge_inbox(endpoint, before, limit).await
    }
    async fn claim_due_timeouts(
        &self,
        endpoint: &str,
        claim: courier::TimeoutClaim,
    ) -> courier::Result<courier::DueTimeouts> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        let due = self.inner.claim_due_timeouts(endpoint, claim).await?;
        let lose = self
            .lose_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose && due.claimed > 0 {
            return Err(courier::Error::new(courier::ErrorKind::Storage {
                detail: "the connection dropped before the reply (test)".into(),
                transient: true,
            }));
        }
        if lose {
            self.lose_replies.fetch_add(1, Ordering::SeqCst);
        }
        Ok(due)
    }
    async fn timeouts_sent(&self, ids: &[String], at: chrono::DateTime<chrono::Utc>) -> courier::Result<()> {
        self.inner.timeouts_sent(ids, at).await
    }
    async fn next_timeout_due(&self, endpoint: &str) -> courier::Result<Option<chrono::DateTime<chrono::Utc>>> {
        self.inner.next_timeout_due(endpoint).await
    }
    async fn unclaim_timeouts(&self, ids: &[String]) -> courier::Result<()> {
        self.inner.unclaim_timeouts(ids).await
    }
    async fn dead_letter_timeout(
        &self,
        endpoint: &str,
        id: &str,
        reason: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> courier::Result<bool> {
        self.inner.dead_letter_timeout(endpoint, id, reason, now).await
    }
    async fn postpone_timeout_reclaim(
        &self,
        endpoint: &str,
        id: &str,
        until: chrono::DateTime<chrono::Utc>,
    ) -> courier::Result<()> {
        self.inner.postpone_timeout_reclaim(endpoint, id, until).await
    }
    async fn endpoint_secret(
        &self,
        endpoint: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> courier::Result<Option<courier::EndpointSecret>> {
        self.inner.endpoint_secret(endpoint, now).await
    }
    fn keeps_history(&self) -> bool {
        self.inner.keeps_history()
    }
    async fn record_history(&self, event: &courier::HistoryEvent) -> courier::Result<()> {
        self.inner.record_history(event).await
    }
    async fn purge_history(
        &self,
        endpoint: &str,
        before: chrono::DateTime<chrono::Utc>,
        limit: i64,
    ) -> courier::Result<u64> {
        self.inner.purge_history(endpoint, before, limit).await
    }
}
