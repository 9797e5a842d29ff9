//! The web console in a real browser: headless Chromium driven over WebDriver
//! (chromedriver, started by each test on a free port), against a console served in
//! this process over the operations API of an embedded broker that runs endpoints here.
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (.ci/run and scripts/test.sh
//! install them when run as root); a missing chromedriver fails the test with what to
//! install. `CHROMEDRIVER` names another chromedriver, `CHROMIUM` another browser.
//!
//! With `COURIER_CONSOLE_SCREENSHOTS=DIR` the tour of the pages saves a PNG of each in DIR
//! (docs/console/ holds the ones the docs show):
//! `COURIER_CONSOLE_SCREENSHOTS=docs/console cargo test -p courier-cli --test console`.

//!
//! Modules: `fixture.rs` (the system under test: an embedded broker in a file, the
//! endpoint `shop` with a failing handler and a saga, the console served in-process),
//! `browser.rs` (Chromium over WebDriver), `http.rs` (a plain HTTP client); the tests:
//! `pages.rs` (every page, with the screenshots, and the error pages), `long_data.rs` (255-byte
//! ids and other long texts at 1,400 px: every column in the window), `dead_letters.rs`
//! (resubmit to a running endpoint, markup shown as text), `security.rs` (tokens, CSRF,
//! loopback, passwords), `sessions.rs` (one session per login, logout, expiry, the login
//! form), `read_only.rs` (an embedded file served without its lock: the application
//! starts, the pages say read-only), `transports.rs` (the same pages over the Postgres transport and
//! over RabbitMQ with a SQLite store, driven over plain HTTP), `history.rs` (a saga's
//! timeline and a message's conversation, over what real endpoints recorded: a saga that
//! timed out, an order dead-lettered and resubmitted), `history_pages.rs` (a conversation
//! of 100 messages legible, hostile text, no history given).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod browser;
mod dead_letters;
mod fixture;
mod history;
mod history_pages;
mod http;
mod long_data;
mod pages;
mod read_only;
mod security;
mod sessions;
mod transports;
