//! The receives of a case: a round of PeekLock receives that completes what it gets (on a
//! session queue, every session `accept_session(Next)` offers), what they saw (`Seen`), and
//! taking a deferred message by its sequence number.

use std::sync::Arc;
use std::time::Duration;

use courier::{EntityPath, ErrorKind, Receiver, SessionSelector, Transport};

use super::oracle::{Failure, class, fail};
use super::row::{Shape, abbreviate};

/// What the receives saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) valid: u32,
    pub(crate) odd: Vec<String>,
    pub(crate) failures: Vec<Failure>,
}

impl Seen {
    async fn took(&mut self, d: courier::Delivery, valid_id: &str) {
        let m = d.message();
        let is_valid = m.message_id() == valid_id;
        let shown = format!(
            "seq {} id {} delivery_count {}",
            m.sequence_number(),
            abbreviate(m.message_id()),
            m.delivery_count()
        );
        if is_valid {
            self.valid += 1;
        } else {
            self.odd.push(shown.clone());
        }
        if let Err(e) = d.complete().await {
            self.failures
                .push(fail(class::COMPLETE_FAILED, format!("{shown}: {e}")));
        }
    }
}

/// Receives (PeekLock, no waiting) and completes until a receive comes back empty.
pub(crate) async fn drain<R: Receiver + ?Sized>(r: &R, valid_id: &str, seen: &mut Seen) -> usize {
    let mut taken = 0;
    for _ in 0..10 {
        match r.receive(100, Duration::ZERO).await {
            Ok(got) if got.is_empty() => break,
            Ok(got) => {
                for d in got {
                    taken += 1;
                    seen.took(d, valid_id).await;
                }
            }
            Err(e) => {
                seen.failures.push(fail(class::RECEIVE_FAILED, format!("receive: {e}")));
                break;
            }
        }
    }
    taken
}

/// One round of receives on `t`: the plain receiver, or every session
/// `accept_session(Next)` offers (`Shape::Sessions`).
pub(crate) async fn round(
    t: &dyn Transport,
    shape: Shape,
    path: &EntityPath,
    receiver: &Arc<dyn Receiver>,
    valid_id: &str,
    seen: &mut Seen,
) {
    if shape != Shape::Sessions {
        drain(&**receiver, valid_id, seen).await;
        return;
    }
    let mut empty = 0;
    for _ in 0..12 {
        match t.accept_session(path, SessionSelector::Next, Duration::ZERO).await {
            Ok(s) => {
                let id = abbreviate(s.session_id());
                if drain(&*s, valid_id, seen).await == 0 {
                    empty += 1;
                }
                if let Err(e) = s.release().await {
                    seen.failures
                        .push(fail(class::RECEIVE_FAILED, format!("release of session {id}: {e}")));
                }
                if empty >= 3 {
                    seen.failures.push(fail(class::SESSION_SPIN, format!("session {id}")));
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::SessionNotAvailable { .. }) => return,
            Err(e) => {
                seen.failures
                    .push(fail(class::RECEIVE_FAILED, format!("accept_session: {e}")));
                return;
            }
        }
    }
}

/// Gets a deferred message by its sequence number (in its session, on a session queue)
/// and completes it.
pub(crate) async fn take_deferred(
    t: &dyn Transport,
    shape: Shape,
    path: &EntityPath,
    receiver: &Arc<dyn Receiver>,
    session: Option<&str>,
    seq: i64,
) -> Result<(), String> {
    let got = match (session, shape) {
        (Some(s), Shape::Sessions) => {
            let session = t
                .accept_session(path, SessionSelector::Named(s.to_owned()), Duration::ZERO)
                .await
                .map_err(|e| format!("accept_session: {e}"))?;
            let got = match session.receive_deferred(&[seq]).await {
                Ok(got) => {
                    let mut n = 0;
                    for d in got {
                        d.complete().await.map_err(|e| format!("complete: {e}"))?;
                        n += 1;
                    }
                    Ok(n)
                }
                Err(e) => Err(format!("receive_deferred: {e}")),
            };
            let _ = session.release().await;
            got?
        }
        _ => {
            let got = receiver
                .receive_deferred(&[seq])
                .await
                .map_err(|e| format!("receive_deferred: {e}"))?;
            let n = got.len();
            for d in got {
                d.complete().await.map_err(|e| format!("complete: {e}"))?;
            }
            n
        }
    };
    if got == 1 {
        Ok(())
    } else {
        Err(format!("receive_deferred returned {got} messages"))
    }
}
