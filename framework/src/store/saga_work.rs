//! The units of work of the SQLite and Postgres stores share their saga methods:
//! [`unit_of_work_with_sagas!`] writes them once, calling the statements of a module
//! (`sqlite_saga` or `pg_saga`) on the transaction's connection.

/// `impl UnitOfWork for $ty { $methods + the saga methods }`: the saga methods call the
/// functions of module `$saga` (`load`, `save`, `complete`, `add_timeouts`,
/// `cancel_timeouts`, `take_timeout`, `cancel_timeout_keys`) on `self.$conn()?`, the transaction's connection.
/// One `#[async_trait]` impl, so that the given methods are rewritten with the others.
///
/// The type's methods hold `record_history`: each store writes its events where they cost
/// least (with the `COMMIT`, with the group's commit, or as the statement that checks the
/// handler left the transaction usable).
macro_rules! unit_of_work_with_sagas {
    ($ty:ty, $($saga:ident)::+, $conn:ident, { $($methods:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::store::UnitOfWork for $ty {
        $($methods)*
        async fn load_saga(
            &mut self,
            saga_type: &str,
            correlation: &str,
        ) -> $crate::error::Result<Option<$crate::store::StoredSaga>> {
            $($saga)::+::load(self.$conn()?, saga_type, correlation).await
        }

        async fn save_saga(
            &mut self,
            saga_type: &str,
            correlation: &str,
            state: &str,
            state_version: u32,
            version: Option<i64>,
            now: chrono::DateTime<chrono::Utc>,
        ) -> $crate::error::Result<()> {
            $($saga)::+::save(self.$conn()?, saga_type, correlation, state, state_version, version, now).await
        }

        async fn complete_saga(
            &mut self,
            saga_type: &str,
            correlation: &str,
            state: &str,
            state_version: u32,
            version: Option<i64>,
            archive: bool,
            now: chrono::DateTime<chrono::Utc>,
        ) -> $crate::error::Result<()> {
            $($saga)::+::complete(
                self.$conn()?, saga_type, correlation, state, state_version, version, archive, now,
            )
            .await
        }

        async fn add_timeouts(
            &mut self,
            endpoint: &str,
            saga_type: &str,
            correlation: &str,
            timeouts: Vec<$crate::store::Timeout>,
            now: chrono::DateTime<chrono::Utc>,
        ) -> $crate::error::Result<()> {
            $($saga)::+::add_timeouts(self.$conn()?, endpoint, saga_type, correlation, timeouts, now).await
        }

        async fn cancel_timeouts(&mut self, ids: &[String]) -> $crate::error::Result<()> {
            $($saga)::+::cancel_timeouts(self.$conn()?, ids).await
        }

        async fn take_timeout(&mut self, id: &str) -> $crate::error::Result<bool> {
            $($saga)::+::take_timeout(self.$conn()?, id).await
        }

        async fn cancel_timeout_keys(
            &mut self,
            saga_type: &str,
            correlation: &str,
            keys: &[String],
        ) -> $crate::error::Result<()> {
            $($saga)::+::cancel_timeout_keys(self.$conn()?, saga_type, correlation, keys).await
        }

        async fn find_saga_by_property(
            &mut self,
            saga_type: &str,
            name: &str,
            value: &str,
        ) -> $crate::error::Result<Option<String>> {
            $($saga)::+::find_by_property(self.$conn()?, saga_type, name, value).await
        }

        async fn set_saga_properties(
            &mut self,
            saga_type: &str,
            correlation: &str,
            properties: &[(String, String)],
        ) -> $crate::error::Result<Option<(String, String)>> {
            $($saga)::+::set_properties(self.$conn()?, saga_type, correlation, properties).await
        }

        async fn mark_saga_completed(
            &mut self,
            saga_type: &str,
            correlation: &str,
            now: chrono::DateTime<chrono::Utc>,
            expires: chrono::DateTime<chrono::Utc>,
        ) -> $crate::error::Result<()> {
            $($saga)::+::mark_completed(self.$conn()?, saga_type, correlation, now, expires).await
        }

        async fn saga_completed_at(
            &mut self,
            saga_type: &str,
            correlation: &str,
            now: chrono::DateTime<chrono::Utc>,
        ) -> $crate::error::Result<Option<chrono::DateTime<chrono::Utc>>> {
            $($saga)::+::completed_at(self.$conn()?, saga_type, correlation, now).await
        }

        }
    };
}
pub(crate) use unit_of_work_with_sagas;
