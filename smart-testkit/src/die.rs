//! Killing a client in process: [`Die`] polls a future a bounded number of
//! times and then drops it, so nothing more of it runs while the WRs it
//! already posted still land, as when a compute blade is SIGKILLed at that
//! await point.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Polls `f` at most `polls` times; `None` if it had not finished by then
/// (it is dropped: it "dies" there).
#[derive(Debug)]
pub struct Die<F> {
    f: Pin<Box<F>>,
    polls: usize,
}

impl<F> Die<F> {
    /// `f`, allowed `polls` polls.
    pub fn after(polls: usize, f: F) -> Die<F> {
        Die { f: Box::pin(f), polls }
    }
}

impl<F: Future> Future for Die<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polls == 0 {
            return Poll::Ready(None);
        }
        self.polls -= 1;
        self.f.as_mut().poll(cx).map(Some)
    }
}
