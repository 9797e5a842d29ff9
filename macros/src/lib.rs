//! Procedural macros of Courier.
//!
//! The macros only generate trait impls and registration data; the runtime lives in the
//! `courier` crate. The message derive, `#[handler]` and `#[saga]` arrive with the
//! handler and saga issues; this crate holds their place in the workspace so that the
//! layout, lints and CI are settled from the start.
