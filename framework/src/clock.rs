//! Time as every component of Courier reads it.
//!
//! Production uses [`SystemClock`]; tests use [`VirtualClock`] and move time forward with
//! [`VirtualClock::advance`], which activates scheduled messages and expires locks and
//! time-to-lives at once, so a one-hour timeout is tested in milliseconds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// A boxed future returned by [`Clock::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of the current time and of timers that follow it.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time, UTC.
    fn now(&self) -> DateTime<Utc>;
    /// A future that completes once [`now`](Clock::now) has reached `deadline`.
    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep;

    /// Which clock this is, when it can tell: two clocks with the same identity always
    /// read the same time (every [`SystemClock`]; the handles of one [`VirtualClock`]).
    /// An endpoint compares its clock with its transport's by it. The default: `None`
    /// (unknown; compared by object instead).
    fn identity(&self) -> Option<usize> {
        None
    }
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn identity(&self) -> Option<usize> {
        Some(0)
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep {
        Box::pin(async move {
            // Re-check after each sleep: the wall clock may have been adjusted meanwhile.
            loop {
                let left = deadline - Utc::now();
                match left.to_std() {
                    Ok(d) if !d.is_zero() => tokio::time::sleep(d).await,
                    _ => return,
                }
            }
        })
    }
}

/// A clock that stands still until a test moves it.
///
/// It is `courier::VirtualClock` (also in [`prelude`](crate::prelude)). Make one with
/// [`VirtualClock::starting_now`] or [`VirtualClock::new`] at a fixed time, give it to the
/// broker with [`EmbeddedBuilder::clock`](crate::EmbeddedBuilder::clock) (or the
/// `clock(..)` of another transport's builder; endpoints on the transport run by it too),
/// and move it with [`advance`](Self::advance) or [`set`](Self::set): whatever was due by
/// then (scheduled messages, expired locks and time-to-lives, saga timeouts) happens at
/// once. Cloning gives another handle to the same clock. The test harness
/// ([`TestEndpoint`](crate::testing::TestEndpoint)) makes one for you
/// ([`TestEndpoint::clock`](crate::testing::TestEndpoint::clock)).
///
/// # Examples
///
/// A message scheduled an hour ahead, received after one hour of virtual time:
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use courier::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), courier::Error> {
/// let clock = VirtualClock::starting_now();
/// let broker = Embedded::builder().in_memory().clock(Arc::new(clock.clone())).open().await?;
/// broker.create_queue("reminders", &QueueOptions::default()).await?;
/// let sender = broker.sender("reminders", SenderOptions::default()).await?;
/// sender.schedule(Envelope::new("remind"), clock.now() + chrono::Duration::hours(1)).await?;
///
/// let receiver = broker.receiver(&EntityPath::queue("reminders")).await?;
/// assert!(receiver.receive(1, Duration::ZERO).await?.is_empty());   // not due yet
/// clock.advance(Duration::from_secs(3600));
/// let due = receiver.receive(1, Duration::from_secs(5)).await?;
/// assert_eq!(due.len(), 1);
/// # for d in due { d.complete().await?; }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct VirtualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
    tick: Arc<watch::Sender<DateTime<Utc>>>,
}

impl VirtualClock {
    /// A virtual clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        let (tick, _) = watch::channel(start);
        Self {
            now: Arc::new(Mutex::new(start)),
            tick: Arc::new(tick),
        }
    }

    /// A virtual clock standing at the current system time (whole milliseconds).
    pub fn starting_now() -> Self {
        let now = Utc::now();
        let ms = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
        Self::new(ms)
    }

    /// Moves the clock forward by `by`; wakes everything waiting for a time up to then.
    pub fn advance(&self, by: Duration) {
        let by = chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = now.checked_add_signed(by).unwrap_or(*now);
        let t = *now;
        drop(now);
        self.tick.send_replace(t);
    }

    /// Sets the clock to `to` (which may not move it backwards: an earlier time is ignored).
    pub fn set(&self, to: DateTime<Utc>) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        if to > *now {
            *now = to;
        }
        let t = *now;
        drop(now);
        self.tick.send_replace(t);
    }
}

impl fmt::Debug for VirtualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("VirtualClock").field(&self.now()).finish()
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn identity(&self) -> Option<usize> {
        // The address of the shared time: the same for every handle of this clock, and
        // never 0 (the system clock's).
        Some(Arc::as_ptr(&self.now) as usize)
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep {
        let mut rx = self.tick.subscribe();
        Box::pin(async move {
            loop {
                if *rx.borrow_and_update() >= deadline {
                    return;
                }
                if rx.changed().await.is_err() {
                    // The clock is gone: nothing will ever advance it.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_tells_one_clock_from_another() {
        let a = VirtualClock::starting_now();
        let b = VirtualClock::new(a.now());
        assert_eq!(a.identity(), a.clone().identity(), "handles of one clock");
        assert_ne!(a.identity(), b.identity(), "two virtual clocks at the same time");
        assert_ne!(a.identity(), SystemClock.identity());
        assert_eq!(SystemClock.identity(), SystemClock.identity());
    }

    #[tokio::test]
    async fn virtual_sleep_completes_only_when_advanced_past_deadline() {
        let clock = VirtualClock::starting_now();
        let deadline = clock.now() + chrono::Duration::seconds(3600);
        let mut sleep = clock.sleep_until(deadline);
        clock.advance(Duration::from_secs(3599));
        assert!(futures_poll_once(&mut sleep).await.is_none());
        clock.advance(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(5), sleep).await.unwrap();
    }

    async fn futures_poll_once(sleep: &mut Sleep) -> Option<()> {
        tokio::select! {
            biased;
            () = sleep.as_mut() => Some(()),
            () = tokio::task::yield_now() => None,
        }
    }

    #[test]
    fn virtual_clock_never_goes_back() {
        let clock = VirtualClock::starting_now();
        let t0 = clock.now();
        clock.set(t0 - chrono::Duration::seconds(10));
        assert_eq!(clock.now(), t0);
    }
}
