//! Killing a client in process: [`Die`] polls a future a bounded number of
//! times and then drops it, so nothing more of it runs while the WRs it
//! already posted still land, as when a compute blade is SIGKILLed at that
//! await point. Stalling one: [`Step`] polls a shared future a bounded
//! number of times and keeps it, to be resumed later.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
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

/// A future shared between the [`Step`]s that drive it.
pub type Shared<F> = Rc<RefCell<Pin<Box<F>>>>;

/// Shares `f` for [`Step`]s.
pub fn shared<F: Future>(f: F) -> Shared<F> {
    Rc::new(RefCell::new(Box::pin(f)))
}

/// Polls a shared future at most `budget` times per `block_on`, then
/// returns `None` with the future kept, to be resumed by the next `Step`:
/// a client stalled mid-operation (but alive).
#[derive(Debug)]
pub struct Step<F: Future> {
    /// The future.
    pub inner: Shared<F>,
    /// Polls left.
    pub budget: u32,
}

impl<F: Future> Future for Step<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.budget == 0 {
            return Poll::Ready(None);
        }
        self.budget -= 1;
        let inner = self.inner.clone();
        let mut f = inner.borrow_mut();
        f.as_mut().poll(cx).map(Some)
    }
}
