-- An application's own table, as docs/stores.md and docs/testing.md show it: created by
-- the application's migrations (`EmbeddedBuilder::migrations`) in the embedded broker's
-- file, written by handlers in the message's transaction, read through
-- `Embedded::read_pool`. The tests of that feature use it too.
CREATE TABLE orders (
    id TEXT PRIMARY KEY NOT NULL,
    total_cents INTEGER NOT NULL
);
