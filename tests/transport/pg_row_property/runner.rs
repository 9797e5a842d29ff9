//! Running the cases of a property: their number (`COURIER_FUZZ_CASES`), the seed
//! (`COURIER_ROW_SEED`), the runtime, and the runner, which stops at the first failure and
//! shrinks it, or with `COURIER_ROW_SURVEY` runs every case and reports the failures by class.

use std::collections::BTreeMap;
use std::fmt;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

use super::oracle::Failure;

/// `COURIER_FUZZ_CASES`, or `default`.
pub(crate) fn cases(default: u32) -> u32 {
    std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The seed of this run: `COURIER_ROW_SEED`, or a random one (printed).
pub(crate) fn seed() -> u64 {
    std::env::var("COURIER_ROW_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0)
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `check` on `cases` rows of `strategy`: stops at the first failure and shrinks it
/// (then fails with the smallest row found), or, with `COURIER_ROW_SURVEY`, runs them
/// all and fails with every class of failure and its shortest row.
pub(crate) fn run<S, F>(name: &str, cases: u32, strategy: S, check: F) -> Result<(), String>
where
    S: Strategy,
    S::Value: fmt::Debug,
    F: Fn(&S::Value) -> Result<(), Vec<Failure>>,
{
    let seed = seed();
    eprintln!("{name}: {cases} cases, seed {seed} (COURIER_ROW_SEED={seed} runs them again)");
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 400,
        max_shrink_time: 180_000,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    if std::env::var_os("COURIER_ROW_SURVEY").is_some() {
        use proptest::strategy::ValueTree;
        let mut classes: BTreeMap<&'static str, (u64, String)> = BTreeMap::new();
        for _ in 0..cases {
            let value = strategy.new_tree(&mut runner).unwrap().current();
            if let Err(failures) = check(&value) {
                let shown = format!("{value:#?}");
                for f in failures {
                    eprintln!("FAILURE {}: {}\n  in {value:?}", f.class, f.detail);
                    let example = format!("{shown}\n  FAILURE: {}", f.detail);
                    let entry = classes.entry(f.class).or_insert((0, example.clone()));
                    entry.0 += 1;
                    if example.len() < entry.1.len() {
                        entry.1 = example;
                    }
                }
            }
        }
        if classes.is_empty() {
            return Ok(());
        }
        let mut report = format!("{name}: failures by class (seed {seed}):\n");
        for (class, (n, example)) in &classes {
            report.push_str(&format!("\n=== {class}: {n} cases; the shortest:\n{example}\n"));
        }
        return Err(report);
    }
    let result = runner.run(&strategy, |value| {
        check(&value).map_err(|failures| {
            let mut s = String::new();
            for f in &failures {
                s.push_str(&format!("\n  FAILURE: {}: {}", f.class, f.detail));
            }
            TestCaseError::fail(s)
        })
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(why, value)) => Err(format!(
            "{name} (seed {seed}): the smallest failing case found:\n{value:#?}{why}"
        )),
        Err(TestError::Abort(why)) => Err(format!("{name} (seed {seed}): aborted: {why}")),
    }
}
