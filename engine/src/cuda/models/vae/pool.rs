//! A decode's buffers allocated ahead of it (lever `vae-prepare = load`):
//! [`Queue`] holds buffers in the order one decode asks for them and hands
//! each out only to the request at its position with its exact size. The
//! device VAE fills a queue by running a decode's setup once (in `load.vae`)
//! and gives it to the decode, so the decode's allocations (device buffers
//! and the pinned RGB8 halves) cost no time inside `decode.video`.
//!
//! A decode that asks for something else (another geometry, chunking or
//! download than the one prepared) drops the rest of the queue at the first
//! request that does not fit and allocates afresh from there: it pays what an
//! unprepared decode pays and never holds two sets of buffers.

use std::collections::VecDeque;

/// A buffer's size in bytes (device buffers; host stand-ins in tests).
pub trait Bytes {
    /// Bytes held.
    fn bytes(&self) -> usize;
}

impl Bytes for crate::cuda::kit::memory::DeviceBuffer {
    fn bytes(&self) -> usize {
        crate::cuda::kit::memory::DeviceBuffer::bytes(self)
    }
}

/// Buffers in allocation order, with what happened to the requests.
#[derive(Debug)]
pub struct Queue<B> {
    bufs: VecDeque<B>,
    served: usize,
    missed: usize,
    /// Buffers dropped unused when a request did not fit.
    dropped: usize,
}

impl<B: Bytes> Queue<B> {
    /// A queue of `bufs`, handed out in this order.
    pub fn new(bufs: impl IntoIterator<Item = B>) -> Queue<B> {
        Queue {
            bufs: bufs.into_iter().collect(),
            served: 0,
            missed: 0,
            dropped: 0,
        }
    }

    /// The next buffer when it holds exactly `bytes`. Otherwise `None` (the
    /// caller allocates), and every buffer still queued is dropped: the decode
    /// has left the prepared order, and later positions would not match.
    pub fn take(&mut self, bytes: usize) -> Option<B> {
        match self.bufs.front() {
            Some(b) if b.bytes() == bytes => {
                self.served += 1;
                self.bufs.pop_front()
            }
            _ => {
                self.missed += 1;
                self.dropped += self.bufs.len();
                self.bufs.clear();
                None
            }
        }
    }

    /// Requests served from the queue.
    pub fn served(&self) -> usize {
        self.served
    }

    /// Requests the queue could not serve (allocated by the caller).
    pub fn missed(&self) -> usize {
        self.missed
    }

    /// Buffers still queued (prepared but not asked for yet).
    pub fn left(&self) -> usize {
        self.bufs.len()
    }

    /// Buffers dropped unused because a request did not fit.
    pub fn dropped(&self) -> usize {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Fake(usize, &'static str);

    impl Bytes for Fake {
        fn bytes(&self) -> usize {
            self.0
        }
    }

    /// The same requests in the same order get the prepared buffers, each
    /// exactly once, in order.
    #[test]
    fn the_prepared_order_is_served_in_order() {
        let mut q = Queue::new([Fake(8, "a"), Fake(16, "b"), Fake(8, "c")]);
        assert_eq!(q.take(8), Some(Fake(8, "a")));
        assert_eq!(q.take(16), Some(Fake(16, "b")));
        assert_eq!(q.take(8), Some(Fake(8, "c")));
        assert_eq!(
            (q.served(), q.missed(), q.left(), q.dropped()),
            (3, 0, 0, 0)
        );
        // Past the end every request is the caller's.
        assert_eq!(q.take(8), None);
        assert_eq!((q.served(), q.missed()), (3, 1));
    }

    /// A request of another size is not served a buffer of the wrong size (a
    /// smaller one would be written past its end), and the rest of the queue
    /// goes: the decode has diverged from the prepared one. Serving on size
    /// alone at any position, or keeping the queue, turns this red.
    #[test]
    fn a_request_of_another_size_drops_the_rest() {
        let mut q = Queue::new([Fake(8, "a"), Fake(16, "b"), Fake(8, "c")]);
        assert_eq!(q.take(8), Some(Fake(8, "a")));
        assert_eq!(q.take(32), None);
        assert_eq!(
            (q.served(), q.missed(), q.left(), q.dropped()),
            (1, 1, 0, 2)
        );
        // "c" fits 8 bytes but is gone: later positions never match by luck.
        assert_eq!(q.take(16), None);
        assert_eq!(q.take(8), None);
        assert_eq!((q.served(), q.missed()), (1, 3));
    }

    /// An empty queue serves nothing and says so.
    #[test]
    fn an_empty_queue_counts_every_request_as_missed() {
        let mut q: Queue<Fake> = Queue::new([]);
        assert_eq!(q.take(1), None);
        assert_eq!(
            (q.served(), q.missed(), q.left(), q.dropped()),
            (0, 1, 0, 0)
        );
    }
}
