//! The history's Postgres statements (`courier.history`, `courier.history_instance`), on
//! the connection of a handling's transaction (a handled event: the Postgres store, a
//! commit group's member, the Postgres transport's store) or on their own (the other
//! events, and the janitor's purge).
//!
//! Postgres's `text` and `jsonb` hold no NUL character, and its `timestamptz` a narrower
//! range than chrono: a NUL in a message id, an error or a body is written as U+FFFD (the
//! body as hex), and a time outside the range is left out (`history::for_postgres`), so
//! that a producer's odd value never fails the handling it describes.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::Result;
use crate::store::db_error;
use crate::store::history::{HistoryEvent, for_postgres};

/// The columns of an event's row, in the order its statements bind them. The last two are
/// the first saga instance it touched (`saga_type`, `correlation`; migration
/// `20261208000001_history_first_instance`); the others go to `courier.history_instance`.
const EVENT_COLUMNS: &str = "endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt, \
     enqueued_at, received_at, detail, saga_type, correlation";

/// The event's row with at most one instance, its parameters `$1` to `$13`: one insert
/// into one table, the common case.
static EVENT_ROW: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    numbered(
        &format!("INSERT INTO courier.history ({EVENT_COLUMNS}) {}", event_values()),
        1,
    )
});

/// An event alone: the statements of [`WithEvents`] before `SELECT 1`.
static ALONE: std::sync::LazyLock<WithEvents> = std::sync::LazyLock::new(|| WithEvents::new(1, "SELECT 1"));

/// `VALUES` of one event's row, its thirteen placeholders not yet numbered.
fn event_values() -> &'static str {
    "VALUES ($_, $_, $_, $_, $_, $_, $_, $_, $_, $_, $_::jsonb, $_, $_)"
}

/// Writes a handled event in the handling's transaction, after the handler's statements:
/// Postgres' refusal of a statement in an aborted transaction means the handler left it
/// so (the handling is told, as `ensure_not_aborted` would tell it, which this replaces).
pub(crate) async fn record_after_handler(conn: &mut PgConnection, event: &HistoryEvent) -> Result<()> {
    record(conn, event)
        .await
        .map_err(crate::store::pg_group::poisoned_if_aborted)
}

/// Writes `event` and the saga instances it touched, in one statement (one round trip).
pub(crate) async fn record(conn: &mut PgConnection, event: &HistoryEvent) -> Result<()> {
    record_one(conn, &Prepared::new(event)?).await
}

/// Writes a prepared event: its row alone (with its first instance), or with its other
/// instance rows inserted from its id in the same statement. A simpler statement than
/// [`record_many`]'s (no sequence call, no arrays), for the common case of one.
async fn record_one(conn: &mut PgConnection, prepared: &Prepared) -> Result<()> {
    let sql = if prepared.more_instances() {
        ALONE.one_more.as_str()
    } else {
        EVENT_ROW.as_str()
    };
    bind_one_event(sqlx::query(sql), prepared)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot record the history of a message", e))?;
    Ok(())
}

/// The common table expressions that insert several events and their instance rows, the
/// parameters numbered from `first`: each event's id is taken from the table's sequence
/// first (`nextval`, in a CTE read twice, so computed once), then the rows (with their
/// first instances) and the other instance rows are inserted from those ids. Parameters:
/// one array per column (`first` to `first + 12`), then the other instance rows' event
/// (its 1-based position), type and correlation. A statement (`WITH ... <statement>`)
/// follows them.
fn events_ctes(first: usize) -> String {
    numbered(
        &format!(
            "WITH event AS (SELECT nextval('courier.history_id_seq') AS id, u.* \
             FROM unnest($_::text[], $_::text[], $_::timestamptz[], $_::text[], $_::text[], $_::text[], \
             $_::text[], $_::int[], $_::timestamptz[], $_::timestamptz[], $_::text[], $_::text[], $_::text[]) \
             WITH ORDINALITY AS u ({EVENT_COLUMNS}, n)), \
             stored AS (INSERT INTO courier.history (id, {EVENT_COLUMNS}) \
             SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt, \
             enqueued_at, received_at, detail::jsonb, saga_type, correlation FROM event), \
             instance AS (INSERT INTO courier.history_instance (history_id, saga_type, correlation) \
             SELECT event.id, i.t, i.c FROM event JOIN unnest($_::bigint[], $_::text[], $_::text[]) AS i (n, t, c) \
             ON i.n = event.n) "
        ),
        first,
    )
}

/// `template` with each `$_` numbered in order, from `$first` on.
fn numbered(template: &str, first: usize) -> String {
    let mut sql = String::with_capacity(template.len() + 32);
    let mut rest = template;
    let mut n = first;
    while let Some(at) = rest.find("$_") {
        sql.push_str(&rest[..at]);
        sql.push('$');
        sql.push_str(&n.to_string());
        n += 1;
        rest = &rest[at + 2..];
    }
    sql.push_str(rest);
    sql
}

/// The common table expression that inserts ONE event's row, with its first instance, the
/// parameters numbered from `first` (`first` to `first + 12`); with `more`, a second that
/// inserts its other instance rows from its id, their types and correlations as two arrays
/// (`first + 13`, `first + 14`). A simpler plan than [`events_ctes`]'s (no sequence call,
/// no arrays of columns, no join) for a handling's one event, the common case. A statement
/// follows them.
fn one_event_ctes(first: usize, more: bool) -> String {
    let stored = format!(
        "WITH stored AS (INSERT INTO courier.history ({EVENT_COLUMNS}) {}",
        event_values()
    );
    let template = if more {
        format!(
            "{stored} RETURNING id), \
             instance AS (INSERT INTO courier.history_instance (history_id, saga_type, correlation) \
             SELECT stored.id, i.t, i.c FROM stored, unnest($_::text[], $_::text[]) AS i (t, c)) "
        )
    } else {
        format!("{stored}) ")
    };
    numbered(&template, first)
}

/// A statement after the inserts of a handling's events, in the three forms the events
/// may need: one event with at most one saga instance, one with more, several. The
/// events' parameters follow the statement's own (`$1` to `first - 1`).
pub(crate) struct WithEvents {
    one: String,
    one_more: String,
    many: String,
}

impl WithEvents {
    pub(crate) fn new(first: usize, statement: &str) -> Self {
        Self {
            one: format!("{}{statement}", one_event_ctes(first, false)),
            one_more: format!("{}{statement}", one_event_ctes(first, true)),
            many: format!("{}{statement}", events_ctes(first)),
        }
    }

    /// The form for `events`, to bind with [`bind_events_if_any`]; none without events.
    pub(crate) fn sql(&self, events: &[Prepared]) -> Option<&str> {
        match events {
            [] => None,
            [one] if one.more_instances() => Some(&self.one_more),
            [_] => Some(&self.one),
            _ => Some(&self.many),
        }
    }
}

/// `query` with the parameters of [`one_event_ctes`] for `prepared` bound next (the
/// other instances' only if it has any).
fn bind_one_event<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    prepared: &'q Prepared,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let instances = prepared.event.instances();
    let query = bind_columns(query, prepared, instances.first().copied());
    if !prepared.more_instances() {
        return query;
    }
    let (types, correlations): (Vec<&'q str>, Vec<&'q str>) = instances.into_iter().skip(1).unzip();
    query.bind(types).bind(correlations)
}

/// `query` with the event's thirteen columns bound next, in [`EVENT_COLUMNS`]' order:
/// its eleven and its `first` saga instance.
fn bind_columns<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    prepared: &'q Prepared,
    first: Option<(&'q str, &'q str)>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let event = &prepared.event;
    query
        .bind(&event.endpoint)
        .bind(event.kind.as_str())
        .bind(event.at)
        .bind(&event.message_id)
        .bind(&event.message_type)
        .bind(&event.conversation_id)
        .bind(&event.causation_id)
        .bind(i32::try_from(event.attempt).unwrap_or(i32::MAX))
        .bind(event.enqueued_at)
        .bind(event.received_at)
        .bind(prepared.detail.as_str())
        .bind(first.map(|(t, _)| t))
        .bind(first.map(|(_, c)| c))
}

/// An event made storable in Postgres ([`for_postgres`]) and its detail rendered: the
/// steps that can fail before the statement, done when the event is recorded.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    event: HistoryEvent,
    detail: String,
    /// How many saga instances it touched (`HistoryEvent::instances`, counted once).
    instances: usize,
}

impl Prepared {
    pub(crate) fn new(event: &HistoryEvent) -> Result<Self> {
        let event = for_postgres(event);
        let detail = super::history::detail_json(&event)?;
        let instances = event.instances().len();
        Ok(Self {
            event,
            detail,
            instances,
        })
    }

    /// Whether the event touched more than one saga instance: those past the first need
    /// rows of `courier.history_instance`.
    fn more_instances(&self) -> bool {
        self.instances > 1
    }
}

/// Writes `events` and the saga instances each touched in one statement (one round trip
/// for a commit group's members, where each event took one); nothing when there are none.
pub(crate) async fn record_many(conn: &mut PgConnection, events: &[Prepared]) -> Result<()> {
    match events {
        [] => return Ok(()),
        [one] => return record_one(conn, one).await,
        _ => {}
    }
    bind_events(sqlx::query(ALONE.many.as_str()), events)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot record the history of the messages", e))?;
    Ok(())
}

/// `query` with the parameters of the events' common table expressions bound next: none
/// (`query` as it is, for its statement without the events), [`one_event_ctes`]'s for
/// one, [`events_ctes`]'s for more; the statement is [`WithEvents::sql`]'s.
pub(crate) fn bind_events_if_any<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    events: &'q [Prepared],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    match events {
        [] => query,
        [one] => bind_one_event(query, one),
        _ => bind_events(query, events),
    }
}

/// `query` with the parameters of [`events_ctes`] for `events` bound next.
fn bind_events<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    events: &'q [Prepared],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let column = |f: fn(&HistoryEvent) -> Option<String>| events.iter().map(|p| f(&p.event)).collect::<Vec<_>>();
    let times = |f: fn(&HistoryEvent) -> Option<DateTime<Utc>>| events.iter().map(|p| f(&p.event)).collect::<Vec<_>>();
    let (mut first_types, mut first_correlations) =
        (Vec::with_capacity(events.len()), Vec::with_capacity(events.len()));
    let (mut owners, mut types, mut correlations) = (Vec::new(), Vec::new(), Vec::new());
    for (n, p) in (1i64..).zip(events) {
        let instances = p.event.instances();
        let mut instances = instances.into_iter();
        let first = instances.next();
        first_types.push(first.map(|(t, _)| t));
        first_correlations.push(first.map(|(_, c)| c));
        for (t, c) in instances {
            owners.push(n);
            types.push(t);
            correlations.push(c);
        }
    }
    query
        .bind(column(|e| Some(e.endpoint.clone())))
        .bind(column(|e| Some(e.kind.as_str().to_owned())))
        .bind(times(|e| Some(e.at)))
        .bind(column(|e| Some(e.message_id.clone())))
        .bind(column(|e| e.message_type.clone()))
        .bind(column(|e| e.conversation_id.clone()))
        .bind(column(|e| e.causation_id.clone()))
        .bind(
            events
                .iter()
                .map(|p| i32::try_from(p.event.attempt).unwrap_or(i32::MAX))
                .collect::<Vec<_>>(),
        )
        .bind(times(|e| e.enqueued_at))
        .bind(times(|e| e.received_at))
        .bind(events.iter().map(|p| p.detail.as_str()).collect::<Vec<_>>())
        .bind(first_types)
        .bind(first_correlations)
        .bind(owners)
        .bind(types)
        .bind(correlations)
}

/// Deletes up to `limit` of `endpoint`'s events older than `before`, oldest first; how
/// many. Their instance rows go with them, by the trigger of migration
/// `20261207000002_history_instance_delete_trigger`, as with any delete of events.
pub(crate) async fn purge(conn: &mut PgConnection, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM courier.history WHERE id IN \
         (SELECT id FROM courier.history WHERE endpoint = $1 AND at < $2 ORDER BY at LIMIT $3)",
    )
    .bind(endpoint)
    .bind(before)
    .bind(limit)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot purge the history", e))?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::{EVENT_ROW, events_ctes, numbered, one_event_ctes};

    #[test]
    fn placeholders_are_numbered_in_order_from_the_first() {
        assert_eq!(numbered("($_, $_::text[], x) $_", 3), "($3, $4::text[], x) $5");
        assert_eq!(numbered("no placeholder", 1), "no placeholder");
        // The events' parameters follow the statement's own: the outbox insert's 7.
        let many = events_ctes(8);
        assert!(!many.contains("$_"));
        assert!(many.contains("unnest($8::text[], $9::text[], $10::timestamptz[]"));
        assert!(many.contains("$18::text[], $19::text[], $20::text[])"));
        assert!(many.contains("unnest($21::bigint[], $22::text[], $23::text[])"));
        assert!(!many.contains("$24"));
        let one = one_event_ctes(8, false);
        assert!(!one.contains("$_"));
        assert!(one.contains("VALUES ($8, $9, $10,"));
        assert!(one.contains("$18::jsonb, $19, $20)"));
        assert!(!one.contains("$21"));
        assert!(!one.contains("history_instance"));
        let more = one_event_ctes(8, true);
        assert!(more.starts_with(&one[..one.len() - 2]));
        assert!(more.contains("unnest($21::text[], $22::text[])"));
        assert!(!more.contains("$23"));
        assert_eq!(EVENT_ROW.matches('$').count(), 13);
        assert!(EVENT_ROW.ends_with("$11::jsonb, $12, $13)"));
    }
}
