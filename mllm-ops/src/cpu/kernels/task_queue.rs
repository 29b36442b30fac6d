//! Tasks taken in order from one shared counter by the calling worker and
//! the pool's other workers, for parallel calls so short (decode's linear
//! layers, tens to hundreds of microseconds) that how the caller waits for
//! the last task matters.
//!
//! rayon's fork-join splits a call into halves, and the thread that ends
//! its half first waits inside the join; a worker waiting there sleeps
//! after a few dozen yields, and waking it again costs tens of
//! microseconds in a VM, after every call. Here the caller waits for the
//! last tasks by running pool jobs and yielding the CPU, never by
//! sleeping. The tasks go out in order, so each thread still reads the
//! weights of one task front to back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rayon::Yield;

/// Counts one finished task when dropped, also when the task panicked, so
/// that the caller's wait ends and the scope can pass the panic on.
struct Finished<'a>(&'a AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Calls `f(scratch, i, item)` for every `(i, item)` of `items`, on the
/// current rayon worker and on as many of its pool's other workers as
/// there are items, each thread taking the next task in order and keeping
/// one `scratch` from `init`. Returns once every call has returned. Called
/// outside a pool, it runs every task on the calling thread.
pub(crate) fn for_each_in_order<T: Send, S>(
    items: Vec<T>,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, T) + Sync,
) {
    let n = items.len();
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let (next, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let work = || {
        let mut scratch = None;
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = slots.get(i) else {
                return;
            };
            let _finished = Finished(&finished);
            let item = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            let item = item.expect("each task is taken once");
            f(scratch.get_or_insert_with(&init), i, item);
        }
    };
    if rayon::current_thread_index().is_none() {
        return work();
    }
    rayon::in_place_scope(|s| {
        for _ in 1..rayon::current_num_threads().min(n) {
            s.spawn(|_| work());
        }
        work();
        wait_awake(|| finished.load(Ordering::Acquire) == n, None);
    });
}

/// Runs the current pool's jobs on this worker, yielding the CPU while
/// there are none, until `done()`; with an `idle_limit`, also until that
/// long has passed without a job. Unlike a wait inside a rayon join, it
/// never sleeps (see the module documentation).
pub(crate) fn wait_awake(done: impl Fn() -> bool, idle_limit: Option<Duration>) {
    let mut idle_since = None;
    while !done() {
        if let Some(Yield::Executed) = rayon::yield_now() {
            idle_since = None;
            continue;
        }
        if let Some(limit) = idle_limit {
            if idle_since.get_or_insert_with(Instant::now).elapsed() >= limit {
                return;
            }
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::pool2;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// Every task runs exactly once with its own index and item, on any
    /// pool size and outside a pool, and the results land in place.
    #[test]
    fn every_task_runs_once_in_place() {
        let run = |n: usize| {
            let mut out = vec![0usize; n];
            let items: Vec<(usize, &mut usize)> = out.iter_mut().enumerate().collect();
            for_each_in_order(
                items,
                || 0usize,
                |calls, i, (j, slot)| {
                    assert_eq!(i, j);
                    *calls += 1;
                    *slot += 1000 + i;
                },
            );
            out
        };
        for n in [0, 1, 2, 3, 64, 1000] {
            let want: Vec<usize> = (0..n).map(|i| 1000 + i).collect();
            assert_eq!(run(n), want, "outside a pool, {n} tasks");
            for threads in 1..=4 {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                let out = pool.expect("pool").install(|| run(n));
                assert_eq!(out, want, "{threads} threads, {n} tasks");
            }
        }
    }

    /// Each thread makes at most one scratch value and keeps it across its
    /// tasks.
    #[test]
    fn each_thread_makes_one_scratch() {
        let made = AtomicUsize::new(0);
        let ran = AtomicUsize::new(0);
        pool2().install(|| {
            for_each_in_order(
                (0..500).collect(),
                || {
                    made.fetch_add(1, Ordering::Relaxed);
                    Vec::<usize>::new()
                },
                |seen: &mut Vec<usize>, i, _: usize| {
                    seen.push(i);
                    ran.fetch_add(1, Ordering::Relaxed);
                },
            )
        });
        assert_eq!(ran.into_inner(), 500);
        assert!((1..=2).contains(&made.into_inner()));
    }

    /// A panicking task reaches the caller, after the other tasks ran,
    /// instead of leaving it waiting for ever.
    #[test]
    fn a_panicking_task_reaches_the_caller() {
        let ran = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool2().install(|| {
                for_each_in_order(
                    (0..100).collect(),
                    || (),
                    |_, i, _: usize| {
                        if i == 37 {
                            panic!("task 37 failed");
                        }
                        ran.fetch_add(1, Ordering::Relaxed);
                    },
                )
            })
        }));
        let err = result.expect_err("the panic must reach the caller");
        assert_eq!(err.downcast_ref::<&str>(), Some(&"task 37 failed"));
        assert_eq!(ran.into_inner(), 99);
    }
}
