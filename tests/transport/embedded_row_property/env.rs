//! The environment shared by the cases: the broker's file (kept for the run), the virtual
//! clock, the tally of outcomes; the entities of a case, made through the broker, and
//! removed with SQL after it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{Clock, Embedded, EntityPath, QueueOptions, TopicOptions, Transport, VirtualClock};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection};

use super::Shape;
use super::row::Row;

pub(super) struct Env {
    _dir: tempfile::TempDir,
    file: PathBuf,
    pub(super) clock: VirtualClock,
    next: AtomicU64,
    pub(super) tally: Mutex<BTreeMap<String, u64>>,
}

pub(super) struct Case {
    pub(super) ids: Vec<i64>,
    pub(super) receiving: i64,
    pub(super) topic: Option<i64>,
    pub(super) send_to: String,
    pub(super) path: EntityPath,
    pub(super) valid_id: String,
    pub(super) valid_session: String,
    pub(super) lock_ms: i64,
}

impl Env {
    pub(super) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("broker.db");
        Self {
            _dir: dir,
            file,
            clock: VirtualClock::starting_now(),
            next: AtomicU64::new(1),
            tally: Mutex::new(BTreeMap::new()),
        }
    }

    pub(super) fn count(&self, what: impl Into<String>) {
        *self.tally.lock().unwrap().entry(what.into()).or_default() += 1;
    }

    pub(super) async fn open(&self) -> courier::Result<Embedded> {
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        Embedded::builder().path(&self.file).clock(clock).open().await
    }

    /// A connection to the file, as another program has it (no broker open).
    pub(super) async fn sql(&self) -> SqliteConnection {
        SqliteConnectOptions::new()
            .filename(&self.file)
            .busy_timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap()
    }

    pub(super) async fn entities(&self, broker: &Embedded, row: &Row) -> Case {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("rowprop-{n}");
        let mut options = QueueOptions::default().max_delivery_count(row.max_delivery_count);
        if let Some(ttl) = row.default_ttl {
            options = options.default_time_to_live(ttl);
        }
        let path = match row.shape {
            Shape::Queue => {
                broker.create_queue(&name, &options).await.unwrap();
                EntityPath::queue(&name)
            }
            Shape::Sessions => {
                broker
                    .create_queue(&name, &options.clone().requires_session(true))
                    .await
                    .unwrap();
                EntityPath::queue(&name)
            }
            Shape::Topic => {
                broker.create_topic(&name, &TopicOptions::default()).await.unwrap();
                broker.create_subscription(&name, "sub", &options).await.unwrap();
                EntityPath::subscription(&name, "sub")
            }
        };
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT id, kind FROM courier_entity WHERE (parent = 0 AND name = ?1) \
             OR parent IN (SELECT id FROM courier_entity WHERE parent = 0 AND name = ?1 AND kind = 1)",
        )
        .bind(&name)
        .fetch_all(broker.read_pool())
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
            valid_id: format!("valid-{n}"),
            valid_session: format!("s-valid-{n}"),
            lock_ms: i64::try_from(options.lock_duration.as_millis()).unwrap(),
        }
    }

    /// Removes the case's rows and entities (no broker open), so that nothing of one case
    /// reaches the next.
    pub(super) async fn clean(&self, case: &Case, odd_id: Option<i64>) {
        let mut conn = self.sql().await;
        let ids = serde_json::to_string(&case.ids).unwrap();
        for sql in [
            "DELETE FROM courier_message WHERE entity_id IN (SELECT value FROM json_each(?1)) OR id = ?2",
            "DELETE FROM courier_session WHERE entity_id IN (SELECT value FROM json_each(?1))",
            "DELETE FROM courier_entity WHERE id IN (SELECT value FROM json_each(?1))",
        ] {
            sqlx::query(sql)
                .bind(&ids)
                .bind(odd_id)
                .execute(&mut conn)
                .await
                .unwrap();
        }
        conn.close().await.unwrap();
    }
}
