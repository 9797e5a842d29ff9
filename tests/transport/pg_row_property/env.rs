//! The environment shared by the cases: one database of the test's own, one transport, one
//! virtual clock, and the tally of outcomes; the entities of a case, made and dropped, and
//! the valid message sent behind the odd row.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{
    Clock, EntityPath, Envelope, PostgresTransport, QueueOptions, SenderOptions, TopicOptions, Transport, VirtualClock,
};
use courier_tests::pg::TestDatabase;
use sqlx::PgPool;

use super::oracle::{Failure, class, fail};
use super::row::{Row, Shape};

/// One database of the test's own: the only live lock holder in it is this test's
/// transport (another test's, closed in the middle of a case, would make a lock the row
/// was given look forged).
pub(super) struct Env {
    pub(super) db: TestDatabase,
    pub(super) clock: VirtualClock,
    pub(super) transport: Arc<PostgresTransport>,
    pub(super) pool: PgPool,
    pub(super) next: AtomicU64,
    pub(super) tally: Mutex<BTreeMap<String, u64>>,
}

/// The entities of one case.
pub(super) struct Case {
    /// Every entity id of the case (queue, or topic and subscription).
    pub(super) ids: Vec<i64>,
    pub(super) receiving: i64,
    pub(super) topic: Option<i64>,
    /// The queue or topic the valid message is sent to.
    pub(super) send_to: String,
    pub(super) path: EntityPath,
    pub(super) valid_id: String,
    pub(super) valid_session: String,
    pub(super) lock_ms: i64,
}

impl Env {
    pub(super) async fn open() -> Self {
        let db = TestDatabase::create().await;
        let clock = VirtualClock::starting_now();
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        // `open` applies the migrations (the transport's and the store's).
        let transport = PostgresTransport::from_pool(db.pool().await)
            .clock(shared)
            .poll_interval(Duration::from_millis(50))
            .open()
            .await
            .unwrap();
        let pool = db.pool().await;
        Self {
            db,
            clock,
            transport: Arc::new(transport),
            pool,
            next: AtomicU64::new(1),
            tally: Mutex::new(BTreeMap::new()),
        }
    }

    pub(super) fn count(&self, what: impl Into<String>) {
        *self.tally.lock().unwrap().entry(what.into()).or_default() += 1;
    }

    pub(super) async fn close(self) {
        self.transport.close().await;
        self.pool.close().await;
        self.db.drop_now().await;
    }

    /// Creates the entities of `row.shape`.
    pub(super) async fn entities(&self, row: &Row, prefix: &str) -> Case {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let mut options = QueueOptions::default().max_delivery_count(row.max_delivery_count);
        if let Some(ttl) = row.default_ttl {
            options = options.default_time_to_live(ttl);
        }
        let t = &self.transport;
        let path = match row.shape {
            Shape::Queue => {
                t.create_queue(&name, &options).await.unwrap();
                EntityPath::queue(&name)
            }
            Shape::Sessions => {
                t.create_queue(&name, &options.clone().requires_session(true))
                    .await
                    .unwrap();
                EntityPath::queue(&name)
            }
            Shape::Topic => {
                t.create_topic(&name, &TopicOptions::default()).await.unwrap();
                t.create_subscription(&name, "sub", &options).await.unwrap();
                EntityPath::subscription(&name, "sub")
            }
        };
        let rows: Vec<(i64, i16)> = sqlx::query_as(
            "SELECT id, kind FROM courier.entity WHERE (parent = 0 AND name = $1) \
             OR parent IN (SELECT id FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = 1)",
        )
        .bind(&name)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let receiving = rows.iter().find(|(_, k)| *k != 1).map(|(id, _)| *id).unwrap();
        let topic = rows.iter().find(|(_, k)| *k == 1).map(|(id, _)| *id);
        Case {
            ids: rows.iter().map(|(id, _)| *id).collect(),
            receiving,
            topic,
            send_to: name,
            path,
            valid_id: format!("valid-{n}-{}", uuid::Uuid::new_v4().simple()),
            valid_session: format!("s-valid-{n}"),
            lock_ms: i64::try_from(options.lock_duration.as_millis()).unwrap(),
        }
    }

    pub(super) async fn send_valid(
        &self,
        case: &Case,
        body: &str,
        message_type: &str,
        session: bool,
    ) -> Result<(), Failure> {
        let mut valid = Envelope::new(body.to_owned())
            .with_message_id(case.valid_id.clone())
            .with_message_type(message_type)
            .with_content_type("application/json");
        if session {
            valid = valid.with_session_id(case.valid_session.clone());
        }
        let sender = self
            .transport
            .sender(&case.send_to, SenderOptions::default())
            .await
            .map_err(|e| fail(class::SEND_FAILED, e.to_string()))?;
        sender
            .send(valid)
            .await
            .map_err(|e| fail(class::SEND_FAILED, e.to_string()))
    }

    pub(super) async fn drop_entities(&self, case: &Case) {
        sqlx::query("DELETE FROM courier.entity WHERE id = ANY($1)")
            .bind(&case.ids)
            .execute(&self.pool)
            .await
            .unwrap();
    }
}
