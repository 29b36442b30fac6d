//! Tasks handed out by shared counters to the calling worker and the
//! pool's other workers, for parallel calls so short (decode's linear
//! layers, tens to hundreds of microseconds) that how the caller waits for
//! the last task matters.
//!
//! rayon's fork-join splits a call into halves, and the thread that ends
//! its half first waits inside the join; a worker waiting there sleeps
//! after a few dozen yields, and waking it again costs tens of
//! microseconds in a VM, after every call. Here the caller waits for the
//! last tasks by running pool jobs and yielding the CPU, never by
//! sleeping.
//!
//! Two ways to hand the tasks out: [`for_each_in_order`] gives the next
//! task to whichever thread asks, so tasks put in order of cost (the
//! heaviest first) end together; [`for_each_in_runs`] cuts the tasks into
//! one run of consecutive tasks per thread, so that a thread reading the
//! weights of its tasks one after the other reads one stretch of memory,
//! and its prefetch for the end of one task fetches the start of its next
//! one. Taken in plain order, each thread's next task was the one after
//! the other thread's, starting where its own prefetch had not reached: in a
//! 1.1B Q4_K_M decode step on two threads, each linear call took 13-21 us
//! longer than half its one-thread time (the attention projections most,
//! against 36-109 us of work); in runs 9-15 us, and decode was 1.032x as
//! fast (1.010-1.075, two sets of eight alternated rounds), the 1.1B Q8_0
//! 1.016x.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    let next = AtomicUsize::new(0);
    let threads = threads_for(items.len());
    run_tasks(items, threads, init, f, |_| {
        Some(next.fetch_add(1, Ordering::Relaxed))
    });
}

/// [`for_each_in_order`] with the tasks cut into one run of consecutive
/// tasks per thread (see the module documentation): each thread takes its
/// own run's tasks front to back, then, with its run done, the last task
/// of the run that has the most left, until none is left.
pub(crate) fn for_each_in_runs<T: Send, S>(
    items: Vec<T>,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, T) + Sync,
) {
    let threads = threads_for(items.len());
    let runs = Runs::new(items.len(), threads);
    run_tasks(items, threads, init, f, |own| {
        runs.front(own).or_else(|| runs.steal())
    });
}

/// Threads that share `n` tasks: the pool's, at most one per task, or the
/// calling thread alone outside a pool.
fn threads_for(n: usize) -> usize {
    if rayon::current_thread_index().is_none() {
        1
    } else {
        rayon::current_num_threads().min(n).max(1)
    }
}

/// Runs `f(scratch, i, item)` for every `(i, item)` of `items` on
/// `threads` threads (as [`threads_for`] gives them), the `k`-th thread to
/// start (from 0) taking task after task `next(k)` until it gives an index
/// past the last task or none; waits for every task without sleeping.
fn run_tasks<T: Send, S>(
    items: Vec<T>,
    threads: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, T) + Sync,
    next: impl Fn(usize) -> Option<usize> + Sync,
) {
    let n = items.len();
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let (started, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let work = || {
        let own = started.fetch_add(1, Ordering::Relaxed);
        let mut scratch = None;
        while let Some(i) = next(own) {
            let Some(slot) = slots.get(i) else {
                return;
            };
            let _finished = Finished(&finished);
            let item = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            let item = item.expect("each task is taken once");
            f(scratch.get_or_insert_with(&init), i, item);
        }
    };
    if threads == 1 {
        return work();
    }
    rayon::in_place_scope(|s| {
        for _ in 1..threads {
            s.spawn(|_| work());
        }
        work();
        wait_awake(|| finished.load(Ordering::Acquire) == n, None);
    });
}

/// Runs of task indices, one per thread, each `front..back` packed into
/// one atomic word (`front` in the high half) so that a thread taking from
/// its front and another taking from its back never both get one task.
struct Runs(Vec<AtomicU64>);

impl Runs {
    /// `n` tasks cut into `parts` runs whose lengths differ by one at most.
    fn new(n: usize, parts: usize) -> Runs {
        let n = u64::try_from(n).ok().filter(|&n| n <= u64::from(u32::MAX));
        let n = n.expect("task indices fit 32 bits");
        let parts = parts.max(1) as u64;
        let bound = |k: u64| n * k / parts;
        Runs(
            (0..parts)
                .map(|k| AtomicU64::new(pack(bound(k), bound(k + 1))))
                .collect(),
        )
    }

    /// Takes the first task left in run `k` (none past the last run).
    fn front(&self, k: usize) -> Option<usize> {
        let run = self.0.get(k)?;
        take(run, |front, back| {
            (front < back).then_some((front, front + 1, back))
        })
    }

    /// Takes the last task of the run with the most tasks left, if any.
    fn steal(&self) -> Option<usize> {
        loop {
            let left = |run: &AtomicU64| {
                let (front, back) = unpack(run.load(Ordering::Relaxed));
                back.saturating_sub(front)
            };
            let run = self.0.iter().max_by_key(|run| left(run))?;
            if left(run) == 0 {
                return None;
            }
            let taken = take(run, |front, back| {
                (front < back).then_some((back - 1, front, back - 1))
            });
            if taken.is_some() {
                return taken;
            }
        }
    }
}

/// `front..back` as one word.
fn pack(front: u64, back: u64) -> u64 {
    front << 32 | back
}

/// The `front..back` of a word.
fn unpack(word: u64) -> (u64, u64) {
    (word >> 32, word & u64::from(u32::MAX))
}

/// Takes a task of `run` by `step`, which maps its `front, back` to the
/// task taken and the new bounds, or to `None` when there is none; retried
/// until no other thread changed the run in between.
fn take(run: &AtomicU64, step: impl Fn(u64, u64) -> Option<(u64, u64, u64)>) -> Option<usize> {
    let mut word = run.load(Ordering::Relaxed);
    loop {
        let (front, back) = unpack(word);
        let (task, front, back) = step(front, back)?;
        let new = pack(front, back);
        match run.compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return usize::try_from(task).ok(),
            Err(now) => word = now,
        }
    }
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

    /// The two ways of handing out tasks, with their names.
    type ForEach =
        fn(Vec<usize>, &(dyn Fn() -> usize + Sync), &(dyn Fn(&mut usize, usize, usize) + Sync));

    fn both() -> [(&'static str, ForEach); 2] {
        [
            ("in order", |items, init, f| {
                for_each_in_order(items, init, f)
            }),
            ("in runs", |items, init, f| for_each_in_runs(items, init, f)),
        ]
    }

    /// Every task runs exactly once with its own index and item, on any
    /// pool size and outside a pool, and the results land in place.
    #[test]
    fn every_task_runs_once_in_place() {
        let run = |n: usize, in_runs: bool| {
            let mut out = vec![0usize; n];
            let items: Vec<(usize, &mut usize)> = out.iter_mut().enumerate().collect();
            let task = |calls: &mut usize, i: usize, (j, slot): (usize, &mut usize)| {
                assert_eq!(i, j);
                *calls += 1;
                *slot += 1000 + i;
            };
            if in_runs {
                for_each_in_runs(items, || 0usize, task);
            } else {
                for_each_in_order(items, || 0usize, task);
            }
            out
        };
        for in_runs in [false, true] {
            for n in [0, 1, 2, 3, 64, 1000] {
                let want: Vec<usize> = (0..n).map(|i| 1000 + i).collect();
                assert_eq!(
                    run(n, in_runs),
                    want,
                    "outside a pool, {n} tasks, runs {in_runs}"
                );
                for threads in 1..=4 {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                    let out = pool.expect("pool").install(|| run(n, in_runs));
                    assert_eq!(out, want, "{threads} threads, {n} tasks, runs {in_runs}");
                }
            }
        }
    }

    /// Each thread makes at most one scratch value and keeps it across its
    /// tasks.
    #[test]
    fn each_thread_makes_one_scratch() {
        for (name, for_each) in both() {
            let made = AtomicUsize::new(0);
            let ran = AtomicUsize::new(0);
            pool2().install(|| {
                for_each(
                    (0..500).collect(),
                    &|| made.fetch_add(1, Ordering::Relaxed),
                    &|_, _, _| {
                        ran.fetch_add(1, Ordering::Relaxed);
                    },
                )
            });
            assert_eq!(ran.into_inner(), 500, "{name}");
            assert!((1..=2).contains(&made.into_inner()), "{name}");
        }
    }

    /// A panicking task reaches the caller, after the other tasks ran,
    /// instead of leaving it waiting for ever.
    #[test]
    fn a_panicking_task_reaches_the_caller() {
        for (name, for_each) in both() {
            let ran = AtomicUsize::new(0);
            let result = catch_unwind(AssertUnwindSafe(|| {
                pool2().install(|| {
                    for_each((0..100).collect(), &|| 0, &|_, i, _| {
                        if i == 37 {
                            panic!("task 37 failed");
                        }
                        ran.fetch_add(1, Ordering::Relaxed);
                    })
                })
            }));
            let err = result.expect_err("the panic must reach the caller");
            assert_eq!(
                err.downcast_ref::<&str>(),
                Some(&"task 37 failed"),
                "{name}"
            );
            assert_eq!(ran.into_inner(), 99, "{name}");
        }
    }

    /// Runs cut the tasks evenly; each run gives its tasks front to back,
    /// and a steal takes the last task of the run with the most left,
    /// until every task was taken exactly once.
    #[test]
    fn runs_give_fronts_then_the_fullest_runs_backs() {
        let runs = Runs::new(10, 3);
        let bounds: Vec<_> = runs
            .0
            .iter()
            .map(|r| unpack(r.load(Ordering::Relaxed)))
            .collect();
        assert_eq!(bounds, [(0, 3), (3, 6), (6, 10)]);
        assert_eq!([runs.front(0), runs.front(0)], [Some(0), Some(1)]);
        assert_eq!(runs.steal(), Some(9), "run 2 has four left");
        assert_eq!(runs.front(2), Some(6));
        assert_eq!(runs.steal(), Some(5), "run 1 has three left, run 2 two");
        let mut taken = vec![0, 1, 9, 6, 5];
        while let Some(i) = runs.front(1).or_else(|| runs.steal()) {
            taken.push(i);
        }
        assert_eq!(runs.front(0), None);
        assert_eq!(runs.front(3), None, "no fourth run");
        taken.sort_unstable();
        assert_eq!(taken, (0..10).collect::<Vec<_>>());
        assert_eq!(Runs::new(0, 2).steal(), None);
    }

    /// On two threads, each thread's tasks are one stretch of consecutive
    /// tasks taken front to back from the start of its run, then any it
    /// took from the other run's back, last first.
    #[test]
    fn each_thread_reads_one_stretch() {
        let taken = Mutex::new(Vec::new());
        pool2().install(|| {
            for_each_in_runs(
                (0..64).collect(),
                || (),
                |_, i, _: usize| {
                    std::hint::black_box((0..2000u64).sum::<u64>());
                    let thread = rayon::current_thread_index();
                    taken
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((thread, i));
                },
            )
        });
        let taken = taken.into_inner().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(taken.len(), 64);
        for thread in [Some(0), Some(1)] {
            let mine: Vec<usize> = taken
                .iter()
                .filter(|t| t.0 == thread)
                .map(|t| t.1)
                .collect();
            // A thread that started after the other had taken its whole
            // run has only stolen tasks.
            let stretch = match mine.first() {
                Some(0 | 32) => mine.windows(2).take_while(|w| w[1] == w[0] + 1).count() + 1,
                _ => 0,
            };
            let stolen = &mine[stretch..];
            assert!(
                stolen.windows(2).all(|w| w[1] < w[0]),
                "thread {thread:?} took {mine:?}"
            );
        }
    }
}
