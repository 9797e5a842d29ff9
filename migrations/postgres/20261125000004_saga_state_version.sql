-- The version of a saga state's shape (Saga::VERSION) it was written at. Rows stored
-- before versions existed are of version 1; a row of an older version is migrated
-- (Saga::migrate) when it is loaded, and saved at the saga's current version.
ALTER TABLE courier.saga ADD COLUMN state_version bigint NOT NULL DEFAULT 1;
ALTER TABLE courier.saga_archive ADD COLUMN state_version bigint NOT NULL DEFAULT 1;
