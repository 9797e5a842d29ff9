//! `#[handler]` goes on a function.

#[courier::handler]
struct OnTick;

fn main() {}
