//! Where the CPU backend runs a step: on a worker of its pool, with the
//! other workers kept awake until the step ends.
//!
//! A step is a few hundred parallel ops with serial stretches between them
//! (norms, rotary, the hand-over from one op to the next). A rayon worker
//! that finds no work sleeps after a few dozen yields, and the next op must
//! then wake it through the kernel, which in a VM is tens of microseconds
//! before it takes its first task. So for the length of a step, each other
//! worker runs [`stay_awake`]: it takes the step's tasks as soon as they
//! exist and yields the CPU in between, the way a spinning thread team
//! would. Measured on 2 cores: 1.1B Q4_K_M decode 1.10x together with finer
//! decode tasks; prefill and batched decode, whose ops slept and woke the
//! same way (about 1300 sleeps per 512-token SmolLM2 prefill), SmolLM2
//! pp128 1.05-1.18x and 32 sequences decoded together 1.17-1.23x.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mllm_core::backend::StepRunner;
use rayon::ThreadPool;

use super::kernels::task_queue::wait_awake;

/// How long a worker kept awake goes without finding a task before it
/// stops waiting and may sleep: longer than the serial stretches between a
/// step's parallel ops, short against a step that has stopped splitting
/// work.
const AWAKE_IDLE: Duration = Duration::from_millis(1);

/// Runs a step inside the backend's pool (see the module documentation).
pub(crate) struct PoolRunner {
    pool: Arc<ThreadPool>,
    /// Whether other workers stay awake during steps: only when the pool
    /// has no more threads than the machine has cores, so that they never
    /// take a core the step's own thread needs.
    keep_awake: bool,
}

impl PoolRunner {
    /// A runner for `pool`.
    pub(crate) fn new(pool: Arc<ThreadPool>) -> PoolRunner {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let keep_awake = (2..=cores).contains(&pool.current_num_threads());
        PoolRunner { pool, keep_awake }
    }
}

impl StepRunner for PoolRunner {
    fn run(&self, f: &mut (dyn FnMut() + Send)) {
        self.pool.install(|| {
            if !self.keep_awake {
                return f();
            }
            let done = AtomicBool::new(false);
            let step_thread = rayon::current_thread_index();
            rayon::in_place_scope(|s| {
                for _ in 1..self.pool.current_num_threads() {
                    s.spawn(|_| stay_awake(&done, step_thread, AWAKE_IDLE));
                }
                f();
                done.store(true, Ordering::Release);
            });
        })
    }
}

/// Runs the pool's tasks on this worker until `done`, yielding the CPU
/// when there are none, and gives up after `idle_limit` without one.
/// Returns at once on `step_thread`, the thread running the step: it only
/// gets here when it picks this job up itself while waiting for a task.
fn stay_awake(done: &AtomicBool, step_thread: Option<usize>, idle_limit: Duration) {
    if rayon::current_thread_index() != step_thread {
        wait_awake(|| done.load(Ordering::Acquire), Some(idle_limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::time::Instant;

    fn pool(threads: usize) -> Arc<ThreadPool> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
        Arc::new(pool.expect("thread pool"))
    }

    /// Runs `steps` steps, each a parallel sum, and checks each sum
    /// and that each step ran once, on a worker.
    fn run_steps(runner: &PoolRunner, steps: u64) {
        for step in 0..steps {
            let mut calls = 0;
            let mut sum = 0;
            let mut worker = None;
            runner.run(&mut || {
                calls += 1;
                worker = rayon::current_thread_index();
                sum = (0..10_000u64).into_par_iter().map(|i| i * step).sum();
            });
            assert_eq!(calls, 1, "step {step}");
            assert!(worker.is_some(), "step {step} ran off the pool");
            assert_eq!(sum, step * 10_000 * 9_999 / 2, "step {step}");
        }
    }

    #[test]
    fn steps_run_once_on_a_worker_with_every_pool_size() {
        for threads in 1..=4 {
            let runner = PoolRunner::new(pool(threads));
            run_steps(&runner, 200);
        }
    }

    #[test]
    fn workers_stay_awake_only_when_each_has_a_core() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(!PoolRunner::new(pool(1)).keep_awake);
        assert_eq!(PoolRunner::new(pool(2)).keep_awake, cores >= 2);
        let over = PoolRunner::new(pool(cores + 1));
        assert!(!over.keep_awake);
        run_steps(&over, 20);
    }

    /// Long enough that a call returning before it cannot have waited.
    const FOREVER: Duration = Duration::from_secs(600);

    /// `stay_awake`'s own duration, called on a worker of `pool`.
    fn time_staying_awake(
        pool: &ThreadPool,
        done: bool,
        own_thread: bool,
        limit: Duration,
    ) -> Duration {
        let done = AtomicBool::new(done);
        pool.install(|| {
            let step_thread = if own_thread {
                rayon::current_thread_index()
            } else {
                None
            };
            let started = Instant::now();
            stay_awake(&done, step_thread, limit);
            started.elapsed()
        })
    }

    #[test]
    fn staying_awake_ends_with_the_step() {
        assert!(time_staying_awake(&pool(2), true, false, FOREVER) < FOREVER);
    }

    #[test]
    fn staying_awake_ends_at_once_on_the_steps_own_thread() {
        assert!(time_staying_awake(&pool(2), false, true, FOREVER) < FOREVER);
    }

    #[test]
    fn staying_awake_gives_up_after_idling() {
        let limit = Duration::from_millis(5);
        assert!(time_staying_awake(&pool(1), false, false, limit) >= limit);
    }
}
