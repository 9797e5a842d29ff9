//! Text that a producer wrote, made safe for a log line.
//!
//! A message id, a correlation id, a header name or value, a content type, a dead-letter
//! description read from a message: whoever sent the message chose these texts, and a log
//! line that prints them as they are hands the producer the operator's terminal (`ESC [`
//! sequences that recolour it, move the cursor or retitle the window, `\r` that overwrites
//! what the line said, `\n` that forges a second log line, U+202E that shows the rest of
//! the line reversed). Every `tracing` field or message part that holds such text goes
//! through [`Escaped`]: `message_id = %Escaped(&envelope.message_id)`.
//!
//! Printable text, ASCII or not, is written as it is, so an ordinary id reads and greps
//! the same in the log as in the message; only the characters that act on a terminal or
//! on the order of the text are escaped, in Rust's notation (`\n`, `\r`, `\t`, `\u{1b}`,
//! `\u{202e}`). A `str` field recorded as a value (`message_type = "..."`) is escaped
//! too, but by the subscriber (the `fmt` layer prints it with `Debug`): [`Escaped`] does
//! not depend on the subscriber.

use std::fmt;

/// Text from a message, escaped for a log line (see the module docs): the control
/// characters (C0, DEL, C1) and the Unicode format and separator characters (bidi
/// embeddings, overrides, isolates and marks, zero-width characters, the byte order mark,
/// tag characters, U+2028 and U+2029) are written as `char::escape_default` writes them;
/// everything else as it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Escaped<'a>(pub(crate) &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let mut start = 0;
        for (i, c) in text.char_indices() {
            if needs_escape(c) {
                f.write_str(&text[start..i])?;
                fmt::Display::fmt(&c.escape_default(), f)?;
                start = i + c.len_utf8();
            }
        }
        f.write_str(&text[start..])
    }
}

/// Whether `c` acts on a terminal or on the order of the text around it: a control
/// character, or a character of the Unicode categories Cf (format), Zl (line separator)
/// or Zp (paragraph separator), as of Unicode 16.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{890}'..='\u{891}'
                | '\u{8e2}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0001}'
                | '\u{e0020}'..='\u{e007f}'
        )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Escaped;
    use crate::fuzz::cases;

    fn escaped(text: &str) -> String {
        Escaped(text).to_string()
    }

    #[test]
    fn printable_text_is_written_as_it_is() {
        for text in [
            "",
            "018f2a3c-7b1d-7e4a-9c2e-5d6f7a8b9c0d",
            "order-42 (retry)",
            "café, e\u{301}, 日本語, 🦀, \\u{1b} typed out",
            "a\u{a0}b\u{3000}c",
        ] {
            assert_eq!(escaped(text), text);
        }
    }

    #[test]
    fn terminal_escapes_line_breaks_and_bidi_controls_are_escaped() {
        assert_eq!(
            escaped("evil-\u{1b}[31m-\r\n-\u{202e}"),
            "evil-\\u{1b}[31m-\\r\\n-\\u{202e}"
        );
        assert_eq!(escaped("\t\u{7}\u{7f}\u{85}\u{9b}"), "\\t\\u{7}\\u{7f}\\u{85}\\u{9b}");
        assert_eq!(
            escaped("\u{200b}\u{200e}\u{2066}x\u{2069}\u{2028}\u{feff}\u{e0041}"),
            "\\u{200b}\\u{200e}\\u{2066}x\\u{2069}\\u{2028}\\u{feff}\\u{e0041}"
        );
        // Through tracing's `%`, as the call sites use it.
        assert_eq!(
            format!("{}", Escaped("id\u{1b}]0;title\u{7}")),
            "id\\u{1b}]0;title\\u{7}"
        );
    }

    /// What must never reach a log line, written out independently of `needs_escape`.
    fn dangerous(c: char) -> bool {
        c.is_control()
            || matches!(
                c,
                '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}'
            )
    }

    /// Characters near and among the ones that are escaped, and any other.
    fn any_char() -> impl Strategy<Value = char> {
        prop_oneof![
            any::<char>(),
            prop::char::range('\0', '\u{1f}'),
            prop::char::range('\u{7f}', '\u{a0}'),
            prop::char::range('\u{2000}', '\u{206f}'),
            prop::char::range('\u{e0000}', '\u{e007f}'),
            prop::sample::select(vec!['\\', '[', '{', 'u', '\u{feff}', '\u{ad}', '\u{61c}']),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn the_output_holds_no_control_character_whatever_the_input(
            chars in prop::collection::vec(any_char(), 0..64),
        ) {
            let input: String = chars.into_iter().collect();
            let output = escaped(&input);
            prop_assert!(!output.chars().any(dangerous), "{:?} gave {:?}", input, output);
            if !input.chars().any(super::needs_escape) {
                prop_assert_eq!(&output, &input);
            }
        }

        #[test]
        fn any_string_is_escaped_safely(input in any::<String>()) {
            prop_assert!(!escaped(&input).chars().any(dangerous));
        }
    }
}
