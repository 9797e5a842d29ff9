//! The library half of `courier-cli`: the web console of the `courier` command
//! ([`console`]), so an application or a test can serve it in-process over its own
//! `courier::admin` (an embedded broker's file can only be changed by the process that
//! runs the broker), and the diff of two saga states that `courier history saga` prints
//! ([`diff`]). The command line itself is the binary `courier` (src/main.rs).

pub mod console;
pub mod diff;

/// The causes of an error worth printing after its own message: each source's text,
/// leaving out one that says nothing new (its text is already in the message or in an
/// earlier cause; wrapped errors often repeat their source).
pub fn causes(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut said = error.to_string();
    let mut out = Vec::new();
    let mut source = error.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !said.contains(&text) {
            said.push('\n');
            said.push_str(&text);
            out.push(text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::causes;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: String,
        #[source]
        inner: Option<Box<Layer>>,
    }

    fn chain(texts: &[&str]) -> Layer {
        texts
            .iter()
            .rev()
            .fold(None, |inner: Option<Layer>, t| {
                Some(Layer {
                    text: (*t).to_owned(),
                    inner: inner.map(Box::new),
                })
            })
            .unwrap_or(Layer {
                text: String::new(),
                inner: None,
            })
    }

    #[test]
    fn a_cause_that_repeats_what_was_said_is_left_out() {
        let e = chain(&[
            "cannot reach db: storage error: cannot connect",
            "storage error: cannot connect",
            "database \"x\" does not exist",
            "database \"x\" does not exist",
        ]);
        assert_eq!(causes(&e), vec!["database \"x\" does not exist".to_owned()]);
        let e = chain(&["outer", "middle", "inner"]);
        assert_eq!(causes(&e), vec!["middle".to_owned(), "inner".to_owned()]);
    }
}
