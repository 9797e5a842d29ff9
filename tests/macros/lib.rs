//! Nothing: the tests of this package are in `main.rs` and `ui/`.
