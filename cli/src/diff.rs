//! What a handling changed in a saga's state, as `courier history saga` prints it: the
//! members changed, added and removed between the state before and after, each as
//! `path: old -> new` with its values as compact JSON. A state that is not JSON (cut to
//! the history's size limit, or written so) gives no diff and says so.
//!
//! Arrays are compared item by item (an item added at the end is one change; one removed
//! at the front changes every later position), objects member by member in name order.

use std::fmt;

use serde_json::Value;

/// One step of a path into a JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// An object's member.
    Member(String),
    /// An array's item.
    Index(usize),
}

/// Where a change is: the steps from the state's root (empty for the root itself).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Path(pub Vec<Step>);

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("$");
        }
        for (i, step) in self.0.iter().enumerate() {
            match step {
                Step::Index(n) => write!(f, "[{n}]")?,
                Step::Member(name) if is_plain(name) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(name)?;
                }
                Step::Member(name) => {
                    let quoted = serde_json::to_string(name).map_err(|_| fmt::Error)?;
                    write!(f, "[{quoted}]")?;
                }
            }
        }
        Ok(())
    }
}

/// A name that reads unambiguously after a dot: letters (of any script), digits and `_`,
/// not beginning with a digit.
fn is_plain(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// One difference between two JSON values.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The value at `path` is another.
    Changed {
        /// Where.
        path: Path,
        /// The value before.
        before: Value,
        /// The value after.
        after: Value,
    },
    /// A member or item that was not there.
    Added {
        /// Where.
        path: Path,
        /// Its value.
        after: Value,
    },
    /// A member or item that is no longer there.
    Removed {
        /// Where.
        path: Path,
        /// Its value before.
        before: Value,
    },
}

/// The most characters of one value a change shows.
pub const SHOWN_VALUE: usize = 80;

/// `value` as compact JSON, cut after `max` characters (with `…`).
pub fn compact(value: &Value, max: usize) -> String {
    let text = value.to_string();
    if text.chars().count() <= max {
        return text;
    }
    let mut out: String = text.chars().take(max).collect();
    out.push('…');
    out
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Changed { path, before, after } => write!(
                f,
                "{path}: {} -> {}",
                compact(before, SHOWN_VALUE),
                compact(after, SHOWN_VALUE)
            ),
            Change::Added { path, after } => write!(f, "{path}: (absent) -> {}", compact(after, SHOWN_VALUE)),
            Change::Removed { path, before } => write!(f, "{path}: {} -> (absent)", compact(before, SHOWN_VALUE)),
        }
    }
}

/// The changes from `before` to `after`, in path order; none when they are equal.
pub fn diff(before: &Value, after: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    let mut path = Vec::new();
    walk(before, after, &mut path, &mut out);
    out
}

fn walk(before: &Value, after: &Value, path: &mut Vec<Step>, out: &mut Vec<Change>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut names: Vec<&String> = b.keys().chain(a.keys()).collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                path.push(Step::Member(name.clone()));
                match (b.get(name), a.get(name)) {
                    (Some(x), Some(y)) => walk(x, y, path, out),
                    (Some(x), None) => out.push(Change::Removed {
                        path: Path(path.clone()),
                        before: x.clone(),
                    }),
                    (None, Some(y)) => out.push(Change::Added {
                        path: Path(path.clone()),
                        after: y.clone(),
                    }),
                    (None, None) => {}
                }
                path.pop();
            }
        }
        (Value::Array(b), Value::Array(a)) => {
            for i in 0..b.len().max(a.len()) {
                path.push(Step::Index(i));
                match (b.get(i), a.get(i)) {
                    (Some(x), Some(y)) => walk(x, y, path, out),
                    (Some(x), None) => out.push(Change::Removed {
                        path: Path(path.clone()),
                        before: x.clone(),
                    }),
                    (None, Some(y)) => out.push(Change::Added {
                        path: Path(path.clone()),
                        after: y.clone(),
                    }),
                    (None, None) => {}
                }
                path.pop();
            }
        }
        (b, a) if b == a => {}
        (b, a) => out.push(Change::Changed {
            path: Path(path.clone()),
            before: b.clone(),
            after: a.clone(),
        }),
    }
}

/// What a handling did to a state, as kept in the history (JSON text, possibly cut).
#[derive(Debug, Clone, PartialEq)]
pub enum StateDiff {
    /// No state before: the instance started with this one.
    Started(Value),
    /// The same state after.
    Unchanged,
    /// What changed.
    Changes(Vec<Change>),
    /// A state that does not parse as JSON (cut to the size limit, or not written as
    /// JSON): no diff.
    Unreadable {
        /// `before` or `after`.
        which: &'static str,
        /// The text's length in bytes.
        bytes: usize,
    },
    /// No state after (nothing kept).
    Unknown,
}

/// The diff of the states `before` and `after` as the history keeps them.
pub fn diff_states(before: Option<&str>, after: Option<&str>) -> StateDiff {
    let parse = |which: &'static str, text: &str| {
        serde_json::from_str::<Value>(text).map_err(|_| StateDiff::Unreadable {
            which,
            bytes: text.len(),
        })
    };
    let Some(after) = after else {
        return StateDiff::Unknown;
    };
    let after = match parse("after", after) {
        Ok(v) => v,
        Err(unreadable) => return unreadable,
    };
    let Some(before) = before else {
        return StateDiff::Started(after);
    };
    match parse("before", before) {
        Ok(before) => {
            let changes = diff(&before, &after);
            if changes.is_empty() {
                StateDiff::Unchanged
            } else {
                StateDiff::Changes(changes)
            }
        }
        Err(unreadable) => unreadable,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    #[test]
    fn changed_added_and_removed_members_read_as_path_old_new() {
        let before = json!({"status": "new", "total": 10, "lines": [{"sku": "A"}], "coupon": "X", "odd key": 1});
        let after = json!({"status": "paid", "total": 10, "lines": [{"sku": "A"}, {"sku": "B"}], "odd key": 2});
        let shown: Vec<String> = diff(&before, &after).iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "coupon: \"X\" -> (absent)",
                "lines[1]: (absent) -> {\"sku\":\"B\"}",
                "[\"odd key\"]: 1 -> 2",
                "status: \"new\" -> \"paid\"",
            ]
        );
        assert_eq!(diff(&json!(1), &json!("1"))[0].to_string(), "$: 1 -> \"1\"");
        let nested = diff(&json!({"a": {"b": [1, 2]}}), &json!({"a": {"b": [1, 3]}}));
        assert_eq!(nested[0].to_string(), "a.b[1]: 2 -> 3");
    }

    #[test]
    fn a_state_that_is_not_json_gives_no_diff_and_says_which() {
        assert_eq!(
            diff_states(Some(r#"{"a":"01"#), Some("{}")),
            StateDiff::Unreadable {
                which: "before",
                bytes: 8
            }
        );
        assert_eq!(
            diff_states(None, Some("{\"a\":1}")),
            StateDiff::Started(json!({"a": 1}))
        );
        assert_eq!(diff_states(Some("{}"), Some("{ }")), StateDiff::Unchanged);
        assert_eq!(diff_states(Some("{}"), None), StateDiff::Unknown);
    }

    #[test]
    fn a_long_value_is_cut() {
        let long = json!("x".repeat(500));
        let text = diff(&json!({"a": 1}), &json!({"a": long}))[0].to_string();
        assert!(text.chars().count() < 2 * SHOWN_VALUE, "{text}");
        assert!(text.ends_with('…'), "{text}");
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            any::<String>().prop_map(Value::String),
            // Few names, so objects share members and arrays share items.
            prop::sample::select(vec!["a", "b", "c d", "é", ""]).prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec!["a", "b", "c d", "é", "", "x.y", "[0]"]).prop_map(str::to_owned),
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `value` with `changes` applied (removals of array items from the end first).
    fn apply(mut value: Value, changes: &[Change]) -> Value {
        fn slot<'a>(root: &'a mut Value, steps: &[Step]) -> &'a mut Value {
            steps.iter().fold(root, |v, step| match (v, step) {
                (Value::Object(m), Step::Member(name)) => m.entry(name.clone()).or_insert(Value::Null),
                (Value::Array(items), Step::Index(i)) => {
                    if *i == items.len() {
                        items.push(Value::Null);
                    }
                    &mut items[*i]
                }
                (v, step) => panic!("{step:?} does not lead into {v}"),
            })
        }
        let mut removals = Vec::new();
        for change in changes {
            match change {
                Change::Changed { path, after, .. } | Change::Added { path, after } => {
                    *slot(&mut value, &path.0) = after.clone();
                }
                Change::Removed { path, .. } => removals.push(path.0.clone()),
            }
        }
        for steps in removals.iter().rev() {
            let (last, parent) = steps.split_last().unwrap();
            match (slot(&mut value, parent), last) {
                (Value::Object(m), Step::Member(name)) => {
                    m.remove(name);
                }
                (Value::Array(items), Step::Index(i)) => {
                    items.remove(*i);
                }
                (v, step) => panic!("cannot remove {step:?} from {v}"),
            }
        }
        value
    }

    proptest! {
        #[test]
        fn equal_values_have_no_change(v in any_json()) {
            prop_assert!(diff(&v, &v.clone()).is_empty());
            let text = v.to_string();
            prop_assert_eq!(diff_states(Some(&text), Some(&text)), StateDiff::Unchanged);
        }

        #[test]
        fn the_changes_turn_before_into_after(before in any_json(), after in any_json()) {
            let changes = diff(&before, &after);
            prop_assert_eq!(changes.is_empty(), before == after);
            prop_assert_eq!(apply(before.clone(), &changes), after);
            for c in &changes {
                // Every change prints, on one line.
                let shown = c.to_string();
                prop_assert!(!shown.contains('\n'), "{}", shown);
            }
        }

        #[test]
        fn any_text_gives_a_diff_or_says_it_cannot(before in ".{0,40}", after in ".{0,40}") {
            let _ = diff_states(Some(&before), Some(&after));
            let _ = diff_states(None, Some(&after));
        }
    }
}
