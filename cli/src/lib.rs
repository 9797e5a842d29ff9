//! The library half of `courier-cli`: the web console of the `courier` command
//! ([`console`]), so an application or a test can serve it in-process over its own
//! `courier::admin` (an embedded broker's file can only be changed by the process that
//! runs the broker). The command line itself is the binary `courier` (src/main.rs).

pub mod console;
